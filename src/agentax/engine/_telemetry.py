"""The one place where the engine emits trace spans and counters (`agentax.trace` names).

The engine's own counters (`Engine.stats()`) never depend on tracing.
"""

from __future__ import annotations

from typing import Any

from agentax.trace import get_tracer, names

__all__ = ["Telemetry"]

_SPANS = {"PREFILL": names.PREFILL, "DECODE_STEP": names.DECODE_STEP}


class Telemetry:
    """Adapter from the engine loop to a tracer (the process tracer unless one is given)."""

    def __init__(self, tracer: Any | None):
        self.tracer = tracer if tracer is not None else get_tracer()

    def span(self, key: str, **args: Any):
        return self.tracer.span(_SPANS[key], track=names.ENGINE_TRACK, args=args or None)

    def counters(self, *, active: int, waiting: int, evictions: int):
        # Called every engine step; most steps change none of these, and a counter track is a
        # step function, so only changes are recorded (the tracer forgets the last values when
        # it starts a new file, so each file starts with a sample of each).
        tracer = self.tracer
        tracer.counter(names.ENGINE_ACTIVE_SLOTS, active, on_change=True)
        tracer.counter(names.ENGINE_WAITING, waiting, on_change=True)
        tracer.counter(names.ENGINE_EVICTIONS, evictions, on_change=True)
