"""Device time at the edges: a span that ends after `block_until_ready`.

JAX dispatch is asynchronous, so a span around a jitted call measures only dispatch. A
`DeviceSpan` ends when the caller blocks on the result at the edge it chooses (once per train
step, not per op), so the hot loop keeps no host syncs. For an XLA-level profile, run
`jax.profiler.start_trace/stop_trace` around the steps you want; its timestamps line up with
the agentax trace (both use the monotonic clock).
"""

from __future__ import annotations

from typing import Any

from agentax.trace import names


def block_until_ready(value: Any) -> Any:
    """`jax.block_until_ready` on a pytree (imports jax only when called)."""
    import jax

    return jax.block_until_ready(value)


class DeviceSpan:
    """A span for device work; ends at `__exit__`, after `block(x)` if the caller called it.

    Its args record `blocked=True` when the end was taken after a sync, so a reader knows
    whether it measured device time or only dispatch.
    """

    __slots__ = ("_tracer", "name", "track", "args", "start_ns", "_blocked_ns")

    def __init__(self, tracer, name: str, track: str | None, args: dict | None) -> None:
        self._tracer, self.name, self.track, self.args = tracer, name, track, dict(args or {})
        self._blocked_ns = None

    def __enter__(self) -> "DeviceSpan":
        self.start_ns = self._tracer.now_ns()
        return self

    def block(self, value: Any) -> Any:
        """Block until `value` (a pytree of arrays) is computed; the span ends here."""
        value = block_until_ready(value)
        self._blocked_ns = self._tracer.now_ns()
        return value

    def set_arg(self, key: str, value: Any) -> None:
        self.args[key] = value

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        end = self._tracer.now_ns() if self._blocked_ns is None else self._blocked_ns
        self.args["blocked"] = self._blocked_ns is not None
        if exc_type is not None:
            self.args[names.ARG_ERROR] = exc_type.__name__
        self._tracer.complete(self.name, self.start_ns, end, track=self.track, args=self.args)
        return False
