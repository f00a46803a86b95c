"""What one optimizer update needs in device memory, read off XLA without running it.

`update_memory` lowers the trainer's own jitted kernels (`accumulate_grads` and `apply_update`
of `agentax.train._step`, with the static options a `TrainerConfig` gives them) on abstract
arguments (`jax.ShapeDtypeStruct`, with their shardings under a mesh), compiles them and reads
XLA's `memory_analysis()`: nothing of the model is allocated, so a 32k-token step of an 8B
model is measured on a laptop's CPU (with fake devices for a mesh:
XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX is imported).

A kernel's peak is arguments + outputs + temporaries - aliased (donated) bytes, per device.
The whole update is the larger of the two kernels' peaks, the gradient kernel's counted with
the optimizer state it does not take but that stays resident meanwhile.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

from agentax.models import ModelConfig, Transformer
from agentax.train._batch import Batch
from agentax.train._config import TrainerConfig
from agentax.train._optim import lr_schedule, make_optimizer
from agentax.train._sharding import DEFAULT_PARTITION_RULES, batch_sharding, param_shardings
from agentax.train._step import GraphDefs, StepOptions, accumulate_grads, apply_update

__all__ = ["KernelMemory", "UpdateMemory", "update_memory"]

GB = 1e9


@dataclasses.dataclass(frozen=True)
class KernelMemory:
    """XLA's memory analysis of one compiled kernel, in bytes per device."""

    arguments: int
    outputs: int
    temps: int
    aliased: int

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs + self.temps - self.aliased

    @classmethod
    def of(cls, compiled) -> "KernelMemory":
        m = compiled.memory_analysis()
        return cls(int(m.argument_size_in_bytes), int(m.output_size_in_bytes),
                   int(m.temp_size_in_bytes), int(m.alias_size_in_bytes))


@dataclasses.dataclass(frozen=True)
class UpdateMemory:
    """Device memory of one update (one micro-batch of `rows` x `seq_len` positions)."""

    gradient: KernelMemory
    """`accumulate_grads`: loss and gradients of the micro-batch, added to the accumulator."""
    update: KernelMemory
    """`apply_update`: the optimizer step."""
    state_bytes: int
    """Trained weights, optimizer state and gradient accumulator (per device)."""
    frozen_bytes: int
    """Frozen weights the step reads (LoRA's base), per device."""
    optimizer_bytes: int
    compile_s: float
    """Lowering and compiling both kernels."""

    @property
    def peak_bytes(self) -> int:
        return max(self.gradient.peak + self.optimizer_bytes, self.update.peak)

    @property
    def activation_bytes(self) -> int:
        """The gradient kernel's memory above the state and frozen weights: what grows with
        the micro-batch (activations, the gradients before they are added, the LM head's
        chunks). The update kernel's own temporaries do not depend on the micro-batch."""
        return (self.gradient.peak + self.optimizer_bytes - self.state_bytes
                - self.frozen_bytes)

    def summary(self) -> dict:
        return {"peak_gb": self.peak_bytes / GB, "state_gb": self.state_bytes / GB,
                "activation_gb": self.activation_bytes / GB,
                "gradient_temps_gb": self.gradient.temps / GB,
                "update_temps_gb": self.update.temps / GB, "compile_s": self.compile_s}


def _nbytes(tree) -> int:
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def abstract_trainer_state(model_config: ModelConfig, config: TrainerConfig):
    """(graphdef, params, rest) as the trainer holds them, as ShapeDtypeStructs: the graphdef
    computes in `compute_dtype` (or the model's dtype), trained floating weights are held in
    `master_dtype`."""
    compute = config.compute_dtype or model_config.dtype
    cfg = dataclasses.replace(model_config, dtype=compute)
    model = nnx.eval_shape(lambda: Transformer(cfg))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    master = jnp.dtype(config.master_dtype)
    params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, master if jnp.issubdtype(x.dtype, jnp.floating)
                                       else x.dtype), params)
    return graphdef, params, rest


def update_memory(model_config: ModelConfig, config: TrainerConfig, *, rows: int, seq_len: int,
                  mesh: Mesh | None = None, rl: bool = True,
                  partition_rules=DEFAULT_PARTITION_RULES) -> UpdateMemory:
    """Compiles the trainer's update kernels for a micro-batch of `rows` x `seq_len` and
    returns their memory (per device); `rl=False` measures the SFT loss.

    Raises:
      ValueError: LoRA configs (not measured here).
    """
    if config.lora is not None:
        raise ValueError("update_memory measures full fine-tuning; set lora=None")
    graphdef, params, rest = abstract_trainer_state(model_config, config)
    tree = {"model": params}
    if mesh is not None:
        place = lambda t: _abstract(t, param_shardings(t, mesh, partition_rules))  # noqa: E731
        row_sharding, scalar = batch_sharding(mesh), NamedSharding(mesh, P())
    else:
        one = SingleDeviceSharding(jax.local_devices()[0])
        place = lambda t: _abstract(t, jax.tree.map(lambda _: one, t))  # noqa: E731
        row_sharding = scalar = one
    tx = make_optimizer(config)
    tree, rest = place(tree), place(rest)
    opt_state = place(jax.eval_shape(tx.init, tree))
    acc = {"grads": tree, "loss": jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar)}

    def tokens(dtype):
        return jax.ShapeDtypeStruct((rows, seq_len), dtype, sharding=row_sharding)

    extra = {}
    if rl:
        extra = dict(behaviour_logprobs=tokens(jnp.float32), versions=tokens(jnp.int32),
                     advantages=tokens(jnp.float32))
    batch = Batch(input_ids=tokens(jnp.int32), target_ids=tokens(jnp.int32),
                  loss_mask=tokens(jnp.float32), segment_ids=tokens(jnp.int32),
                  positions=tokens(jnp.int32), **extra)
    counts = {k: jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar) for k in ("tokens", "seqs")}
    leaf_shardings = lambda t: tuple(x.sharding for x in jax.tree.leaves(t))  # noqa: E731
    acc_shardings = leaf_shardings(acc) if mesh is not None else None
    state_shardings = leaf_shardings((tree, opt_state, acc)) if mesh is not None else None
    schedule = jax.ShapeDtypeStruct(lr_schedule(config).shape, jnp.float32, sharding=scalar)

    t0 = time.perf_counter()
    grad = accumulate_grads.lower(
        GraphDefs(model=graphdef), tree, rest, batch, counts, acc, rl=config if rl else None,
        opts=StepOptions.from_config(config, mesh, model_config.vocab_size), acc_shardings=acc_shardings).compile()
    upd = apply_update.lower(tree, opt_state, acc, counts["tokens"], schedule, tx=tx,
                             state_shardings=state_shardings).compile()
    compile_s = time.perf_counter() - t0
    per_device = _per_device_bytes if mesh is not None else _nbytes
    state = per_device(tree) + per_device(opt_state) + per_device(acc)
    return UpdateMemory(gradient=KernelMemory.of(grad), update=KernelMemory.of(upd),
                        state_bytes=state, frozen_bytes=per_device(rest),
                        optimizer_bytes=per_device(opt_state), compile_s=compile_s)


def _per_device_bytes(tree) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += int(np.prod(shape)) * jnp.dtype(x.dtype).itemsize
    return total
