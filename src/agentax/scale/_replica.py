"""`RayEngineReplica`: an `Engine` inside a Ray actor, driven through the engine API.

On a cluster each replica is an actor placed on its own accelerators (`num_gpus`, custom
`resources` such as `{"TPU": 4}`); put several behind an `EngineRouter`. The actor builds its
engine with `make_engine()` (called in the actor process, so weights load where they run),
serves `generate` on its own event loop (the engine batches concurrent requests as usual) and
takes weights as host arrays, which it puts on its devices before the swap.

Engine errors raised in the actor (`SequenceError`, `PromptTooLong`, `EngineError`) come back
as exceptions of the same class (Ray's task errors subclass the cause).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agentax.records import Completion, SamplingParams
from agentax.scale._ray import ensure_ray_initialized, require_ray

__all__ = ["RayEngineReplica"]


class _EngineActor:
    """Body of the engine actor."""

    def __init__(self, make_engine: Callable[[], Any]) -> None:
        self.engine = make_engine()

    async def generate(self, prompt_ids: Any, params: Any, sequence_id: int | None) -> Completion:
        return await self.engine.generate(prompt_ids, params, sequence_id=sequence_id)

    def release(self, sequence_id: int) -> None:
        self.engine.release(sequence_id)

    def update_weights(self, state: Any, version: int) -> int:
        import jax  # noqa: PLC0415 - the actor process owns the devices

        self.engine.update_weights(jax.device_put(state), version)
        return version

    def policy_version(self) -> int:
        return self.engine.policy_version

    def stats(self) -> Any:
        return self.engine.stats()

    def shutdown(self) -> None:
        self.engine.shutdown()


_ACTOR_CLASS: Any = None


class RayEngineReplica:
    """One engine in a Ray actor, with the engine's front end.

    Args:
      make_engine: zero-argument callable building the `Engine` (pickled, run in the actor).
      num_cpus / num_gpus / resources: what Ray reserves for the actor (its placement).
      actor_options: further `ray.remote` options.
      call_timeout_s: limit for the blocking control calls (`policy_version`, `stats`,
        `update_weights`, `shutdown`); generation is bounded by the collector's model timeout.
    """

    def __init__(
        self,
        make_engine: Callable[[], Any],
        *,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        resources: Mapping[str, float] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        call_timeout_s: float = 120.0,
    ) -> None:
        global _ACTOR_CLASS
        self._ray = ray = require_ray()
        ensure_ray_initialized(ray)
        if _ACTOR_CLASS is None:
            _ACTOR_CLASS = ray.remote(_EngineActor)
        options = {"num_cpus": num_cpus, "num_gpus": num_gpus, **dict(actor_options or {})}
        if resources:
            options["resources"] = dict(resources)
        # Requests of many episodes must be in flight at once for the engine to batch them.
        options.setdefault("max_concurrency", 1000)
        self.call_timeout_s = call_timeout_s
        self.actor = _ACTOR_CLASS.options(**options).remote(make_engine)

    async def generate(
        self, prompt_ids: Any, params: SamplingParams | None = None, *, sequence_id: int | None = None
    ) -> Completion:
        """`Engine.generate` in the actor (awaitable from any event loop)."""
        return await self.actor.generate.remote(prompt_ids, params, sequence_id)

    def release(self, sequence_id: int | None) -> None:
        """Fire-and-forget release of a sequence."""
        if sequence_id is not None:
            self.actor.release.remote(int(sequence_id))

    def update_weights(self, state: Any, version: int) -> None:
        """Ships the weights (as host arrays) to the actor and waits until it has queued the swap."""
        import jax  # noqa: PLC0415

        host = state if isinstance(state, self._ray.ObjectRef) else jax.device_get(_as_state(state))
        self._ray.get(self.actor.update_weights.remote(host, int(version)), timeout=self.call_timeout_s)

    @property
    def policy_version(self) -> int:
        return int(self._ray.get(self.actor.policy_version.remote(), timeout=self.call_timeout_s))

    def stats(self) -> Any:
        return self._ray.get(self.actor.stats.remote(), timeout=self.call_timeout_s)

    def shutdown(self) -> None:
        try:
            self._ray.get(self.actor.shutdown.remote(), timeout=self.call_timeout_s)
        except Exception:  # noqa: BLE001 - already dead
            pass
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass


def _as_state(state: Any) -> Any:
    from flax import nnx  # noqa: PLC0415

    return nnx.state(state) if isinstance(state, nnx.Module) else state
