"""The router's small parts: its stats record, the errors it raises, and weight placement
helpers (shared with `RayEngineReplica`). jax, flax and the engine are imported lazily, as in
`_router.py`, so `agentax.scale` stays cheap to import."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from agentax.scale._weight_sync import WeightSyncStats

__all__ = ["RouterStats"]


def _engine_error() -> type:
    from agentax.engine import EngineError  # noqa: PLC0415 - see the module docstring

    return EngineError


class _Lost(Exception):
    """Internal: the replica serving a request was dropped; the request re-runs elsewhere."""

    def __init__(self, index: int, reason: str):
        super().__init__(index, reason)
        self.index, self.reason = index, reason


_LOST_CLASS: Any = None


def _replicas_lost(message: str) -> Exception:
    """A `ReplicasLost` error: an `EngineError` (so the pipeline's breaker stops the run with
    `RunFailed`) saying that no replica is left. The class subclasses the engine's error, so it
    is made on first use (see the module docstring)."""
    global _LOST_CLASS
    if _LOST_CLASS is None:
        _LOST_CLASS = type("ReplicasLost", (_engine_error(),), {
            "__doc__": "Every replica of an `EngineRouter` was dropped; the message names them.",
            "__module__": __name__})
    return _LOST_CLASS(message)

@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterStats:
    """A snapshot of the router and its replicas."""

    replicas: tuple[Any, ...]
    """Each replica's own `stats()` (an `EngineStats` for local engines)."""
    live_sequences: tuple[int, ...]
    """Conversations routed to each replica and not yet released (its load)."""
    routed: tuple[int, ...]
    """New conversations sent to each replica so far."""
    continuations: int
    """Requests that continued a conversation on its replica."""
    down: tuple[int, ...]
    """Replicas taken out of rotation after they failed."""
    policy_version: int
    published_version: int | None
    dropped: tuple[str, ...] = ()
    """One line per dropped replica: which, why, at which stage."""
    reruns: dict[str, int] = dataclasses.field(default_factory=dict)
    """Requests in flight on a dropped replica that re-ran on another one, by reason."""
    moved: dict[str, int] = dataclasses.field(default_factory=dict)
    """Conversations whose replica was dropped between two turns, continued on another one
    (history prefilled there), by reason."""
    weight_sync: WeightSyncStats | None = None
    """Counters of the parallel publisher (None: replicas are updated one by one)."""


def _resolve(fut: asyncio.Future, reason: str) -> None:
    if not fut.done():
        fut.set_result(reason)


def _retrieve(task: asyncio.Future) -> None:
    """Reads an abandoned request's outcome (no 'exception was never retrieved')."""
    if not task.cancelled():
        task.exception()


class _DevicePlacement:
    """Commits a pytree of weights to one device (a reshard when it lives elsewhere)."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def __call__(self, state: Any) -> Any:
        import jax  # noqa: PLC0415

        return jax.device_put(state, self.device)

    def __repr__(self) -> str:
        return f"_DevicePlacement({self.device})"


def _as_state(state: Any) -> Any:
    """A model becomes its `nnx.State` (placements move arrays, not modules)."""
    from flax import nnx  # noqa: PLC0415

    if isinstance(state, nnx.Module):
        return nnx.state(state)
    return state
