"""Where the engine and the trainer live, and how weights travel between them.

* **colocated** — trainer and engine share devices. Publishing writes the trainer's
  parameters into the engine's own weight buffers on the same devices (cast to the engine's
  dtype in one donated kernel between two engine calls: the engine never holds two versions,
  and the train step, which donates its own buffers, may run as soon as it returns), no host
  round trip and no reshard.
* **disaggregated** — the trainer's mesh and the engine's device are disjoint subsets of the
  same device list. Publishing reshards: `jax.device_put` moves each parameter from the
  trainer's sharding onto the engine's device, between two decode steps.

Either way the engine may span several devices (`engine_devices=k`): it is then sharded over
them by tensor parallelism (`engine_mesh`, a mesh whose 'tensor' axis has k devices), and
publishing reshards each parameter from the trainer's sharding onto the engine's, with no
gather onto one device. `Placement.split(devices, engine_devices=k)` carves a device list
into the two sets; `placement.engine_model(model)` puts a model on the engine's devices (build
the Engine from it under `placement.engine_scope()`, passing `mesh=placement.engine_mesh`),
and `placement.publisher()` is the `publish` callable for `Pipeline`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import jax
from flax import nnx
from jax.sharding import Mesh

from agentax.engine import Engine
from agentax.train import RLTrainer, SFTTrainer

__all__ = ["Placement"]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Devices of the trainer (a mesh) and of the engine (one device, or a tensor mesh)."""

    kind: Literal["colocated", "disaggregated"]
    trainer_mesh: Mesh | None
    engine_device: Any
    """The engine's (first) device."""
    engine_mesh: Mesh | None = None
    """The engine's tensor-parallel mesh when it spans several devices (pass it to `Engine`)."""

    @classmethod
    def colocated(cls, trainer_mesh: Mesh | None = None, *,
                  engine_devices: int = 1) -> "Placement":
        """Engine on the first `engine_devices` devices of the trainer's mesh (or of
        `jax.devices()`), tensor-parallel when more than one."""
        devices = (list(trainer_mesh.devices.flat) if trainer_mesh is not None
                   else jax.devices())
        return cls("colocated", trainer_mesh, devices[0],
                   _engine_mesh(devices[:engine_devices], engine_devices))

    @classmethod
    def split(cls, devices: Sequence[Any] | None = None, *, engine_devices: int = 1) -> "Placement":
        """Disaggregated: the last `engine_devices` devices serve, the others train (data axis).

        Raises:
          ValueError: fewer than `engine_devices + 1` devices.
        """
        from agentax.train import make_mesh

        devices = list(jax.devices() if devices is None else devices)
        if engine_devices < 1:
            raise ValueError(f"engine_devices must be >= 1, got {engine_devices}")
        if len(devices) < engine_devices + 1:
            raise ValueError(
                f"a disaggregated placement needs at least {engine_devices + 1} devices, have "
                f"{len(devices)} (on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N)"
            )
        trainer_devices = devices[: len(devices) - engine_devices]
        mesh = make_mesh(data=len(trainer_devices), devices=trainer_devices)
        engine = devices[len(devices) - engine_devices:]
        return cls("disaggregated", mesh, engine[0], _engine_mesh(engine, engine_devices))

    def engine_scope(self) -> contextlib.AbstractContextManager:
        """Context in which to build the Engine (its KV cache lands on the engine device)."""
        return jax.default_device(self.engine_device)

    def engine_model(self, model: nnx.Module) -> nnx.Module:
        """A copy of `model` whose parameters live on the engine's device(s)."""
        graphdef, state = nnx.split(model)
        if self.engine_mesh is not None:
            from agentax.models import shard_params

            return nnx.merge(graphdef, shard_params(state, self.engine_mesh))
        return nnx.merge(graphdef, jax.device_put(state, self.engine_device))

    def publisher(self):
        """The `publish(trainer, engine, version)` callable for `Pipeline`."""

        def publish(trainer: Any, engine: Any, version: int) -> None:
            # The engine puts each parameter onto its own sharding: a move onto its device
            # (disaggregated), or a reshard per tensor onto its mesh; nothing when colocated.
            publish_into(trainer, engine, version)

        return publish


def publish_into(trainer: Any, engine: Any, version: int) -> None:
    """Publishes the trainer's weights to the engine. An agentax `Engine` fed by an agentax
    trainer takes them in place (`Engine.update_weights(..., in_place=True)`: written into the
    engine's own buffers and cast there, so no second copy of the weights is held; the trainer
    waits for the engine's current call to end); anything else gets `update_weights(
    trainer.params_for_engine(), version)`."""
    if isinstance(engine, Engine) and isinstance(trainer, (RLTrainer, SFTTrainer)):
        engine.update_weights(trainer.params_for_engine(live=True), version, in_place=True)
    else:
        engine.update_weights(trainer.params_for_engine(), version)


def _engine_mesh(devices: Sequence[Any], n: int) -> Mesh | None:
    from agentax.models import make_mesh

    if n < 1 or n > len(devices):
        raise ValueError(f"engine_devices={n} needs {n} devices, have {len(devices)}")
    return make_mesh(tensor=n, devices=devices[:n]) if n > 1 else None
