"""The one place where the engine emits trace spans and counters.

`agentax.trace` (layer 1, built by the tracing team) provides `get_tracer()` and the standard
names in `agentax.trace.names`. When it is not importable yet (or a tracer lacks a method) the
engine records nothing; the engine's own counters (`Engine.stats()`) never depend on it.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["Telemetry"]

# Fallback names, the same as `agentax.trace.names` (used only if it cannot be imported).
_NAMES = {
    "PREFILL": "prefill",
    "DECODE_STEP": "decode_step",
    "ENGINE_ACTIVE_SLOTS": "engine_active_slots",
    "ENGINE_WAITING": "engine_waiting",
    "ENGINE_EVICTIONS": "engine_evictions",
    "ENGINE_TRACK": "engine",
}


def _default_tracer() -> Any | None:
    try:
        from agentax.trace import get_tracer  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        return get_tracer()
    except Exception:  # a tracer that cannot start must not stop generation
        return None


def _names() -> dict[str, str]:
    names = dict(_NAMES)
    try:
        from agentax.trace import names as trace_names  # type: ignore[attr-defined]
    except ImportError:
        return names
    for key in names:
        names[key] = getattr(trace_names, key, names[key])
    return names


class Telemetry:
    """Adapter from the engine loop to a tracer (or to nothing)."""

    def __init__(self, tracer: Any | None):
        self.tracer = tracer if tracer is not None else _default_tracer()
        self.names = _names()
        self._has_span = hasattr(self.tracer, "span")
        self._has_counter = hasattr(self.tracer, "counter")

    def span(self, key: str, **args: Any):
        if not self._has_span:
            return contextlib.nullcontext()
        track = self.names["ENGINE_TRACK"]
        return self.tracer.span(self.names[key], track=track, args=args or None)

    def counters(self, *, active: int, waiting: int, evictions: int):
        if not self._has_counter:
            return
        # Called every engine step; most steps change none of these, and a counter track is a
        # step function, so only changes are recorded (the tracer forgets the last values when
        # it starts a new file, so each file starts with a sample of each).
        tracer, names = self.tracer, self.names
        tracer.counter(names["ENGINE_ACTIVE_SLOTS"], active, on_change=True)
        tracer.counter(names["ENGINE_WAITING"], waiting, on_change=True)
        tracer.counter(names["ENGINE_EVICTIONS"], evictions, on_change=True)
