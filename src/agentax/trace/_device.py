"""Device time at the edges: spans that end after `block_until_ready`, and a profiler window.

JAX dispatch is asynchronous, so a span around a jitted call measures only dispatch. A
`DeviceSpan` ends when the caller blocks on the result at the edge it chooses (once per train
step, not per op), so the hot loop keeps no host syncs. `ProfileWindow` runs
`jax.profiler.start_trace/stop_trace` for a chosen step range and marks it on the
"profiler" track so the XLA profile can be lined up with the agentax timeline.
"""

from __future__ import annotations

import os
from typing import Any

from agentax.trace import names


def block_until_ready(value: Any) -> Any:
    """`jax.block_until_ready` on a pytree (imports jax only when called)."""
    import jax

    return jax.block_until_ready(value)


class DeviceSpan:
    """A span for device work; ends at `__exit__`, after `block(x)` if the caller called it.

    The span's args record `blocked=True` when the end was taken after a sync, so a reader
    knows whether it measured device time or only dispatch.
    """

    __slots__ = ("_tracer", "name", "track", "args", "start_ns", "_blocked_ns")

    def __init__(self, tracer, name: str, track: str | None, args: dict | None) -> None:
        self._tracer, self.name, self.track, self.args = tracer, name, track, args
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
        if self.args is None:
            self.args = {}
        self.args[key] = value

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        end = self._blocked_ns if self._blocked_ns is not None else self._tracer.now_ns()
        args = dict(self.args or ())
        args["blocked"] = self._blocked_ns is not None
        if exc_type is not None:
            args[names.ARG_ERROR] = exc_type.__name__
        self._tracer.complete(self.name, self.start_ns, end, track=self.track, args=args)
        return False


class ProfileWindow:
    """Capture a `jax.profiler` trace for train steps ``start <= step < stop``.

    Call `window.step(step)` once per train step (before the step runs); the window starts at
    `start`, stops at `stop` (or at `close()`), and is marked on the Perfetto "profiler" track
    as a `profiler_window` span with args ``{"start_step", "stop_step", "out_dir"}``.

    Args:
      steps: (start, stop) step range, stop exclusive.
      out_dir: where jax writes the profile (TensorBoard / Perfetto format).
      tracer: the tracer to mark the window in (default: the process tracer).
    """

    def __init__(self, *, steps: tuple[int, int], out_dir: str | os.PathLike,
                 tracer=None) -> None:
        start, stop = steps
        if not 0 <= start < stop:
            raise ValueError(f"ProfileWindow steps must satisfy 0 <= start < stop, got {steps}")
        from agentax.trace._tracer import get_tracer

        self.start_step, self.stop_step = int(start), int(stop)
        self.out_dir = os.fspath(out_dir)
        self.tracer = tracer or get_tracer()
        self.active = False
        self.done = False
        self._start_ns = 0
        self._started_at = -1

    def step(self, step: int) -> None:
        """Tell the window the step about to run; starts/stops the profiler at the edges."""
        if self.active and step >= self.stop_step:
            self._stop(step)
        elif not self.active and not self.done and self.start_step <= step < self.stop_step:
            self._start(step)

    def _start(self, step: int) -> None:
        import jax

        os.makedirs(self.out_dir, exist_ok=True)
        jax.profiler.start_trace(self.out_dir)
        self.active = True
        self._started_at = step
        self._start_ns = self.tracer.now_ns()
        self.tracer.instant("profiler_start", track=names.PROFILER_TRACK,
                            args={"step": step, "out_dir": self.out_dir})

    def _stop(self, step: int) -> None:
        import jax

        jax.profiler.stop_trace()
        self.active = False
        self.done = True
        self.tracer.complete(names.PROFILER_WINDOW, self._start_ns, self.tracer.now_ns(),
                             track=names.PROFILER_TRACK,
                             args={"start_step": self._started_at, "stop_step": step,
                                   "out_dir": self.out_dir})

    def close(self, step: int | None = None) -> None:
        """Stop the profiler if the run ends inside the window."""
        if self.active:
            self._stop(self.stop_step if step is None else step)

    def __enter__(self) -> "ProfileWindow":
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False
