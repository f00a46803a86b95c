"""The process-wide tracer: spans, instants, counters and flows appended to a bounded buffer.

Recording is one `deque.append` of a small tuple (atomic under the GIL, no lock, no I/O); a
background thread (`agentax.trace._writer`) drains the buffer into a Perfetto trace file.
Without a writer the buffer is a flight recorder: it keeps the newest `capacity` events.
The current track lives in a `ContextVar`, so a span opened on `episode/17` inside a coroutine
makes every span nested under it (across `await`, and in tasks created inside it) land on the
same track, while other coroutines on the same thread keep their own tracks.
JAX dispatch is asynchronous, so a span around a jitted call measures only the dispatch; a
`DeviceSpan` ends when the caller blocks on the result at the edge it chooses (once per train
step). For an XLA-level profile use `jax.profiler.start_trace/stop_trace` (same clock).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
import os
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from agentax.trace._files import TRACE_FILENAME
from agentax.trace.names import ARG_ERROR, DEVICE_CALL, HOST_INFO

# Event kinds in the buffer. Every record is an 8-tuple:
# (kind, start_ns, end_ns, track, name, args_or_value, flow_out, flow_in)
SPAN, INSTANT, COUNTER = 0, 1, 2


class ThreadTrack(NamedTuple):
    """The default track of one OS thread."""

    tid: int
    name: str


def block_until_ready(value: Any) -> Any:
    """`jax.block_until_ready` on a pytree (imports jax only when called)."""
    import jax

    return jax.block_until_ready(value)


class _NoopSpan:
    """What `Tracer.span` returns while tracing is off: costs one call and nothing else."""

    __slots__ = ()

    def __enter__(self) -> "_NoopSpan":
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def set_arg(self, key: str, value: Any) -> None:
        """Does nothing (tracing is off)."""

    def block(self, value: Any) -> Any:
        """Syncs anyway, so code around device spans behaves the same with tracing off."""
        return block_until_ready(value)


NOOP_SPAN = _NoopSpan()


class Span:
    """An open span; use as a context manager (`with tracer.span(...) as s:`).

    Built by `Tracer.span` without running an `__init__` (one frame less on the hot path);
    `__enter__` takes the start time and track, `__exit__` appends the record tuple.
    """

    __slots__ = ("_tracer", "name", "track", "args", "flow_out", "flow_in", "start_ns", "end_ns",
                 "_token")

    def __enter__(self) -> "Span":
        tracer = self._tracer
        if self.track is None:
            self._token = None
            self.track = tracer._current_track.get() or tracer._thread_track()
        else:
            self._token = tracer._current_track.set(self.track)
        self.start_ns = tracer._clock()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        tracer = self._tracer
        end_ns = self.end_ns or tracer._clock()  # set earlier by `DeviceSpan.block`
        if self._token is not None:
            try:
                tracer._current_track.reset(self._token)
            except ValueError:  # exited in another context (e.g. a generator); nothing to undo
                pass
        if exc_type is not None:
            self.set_arg(ARG_ERROR, exc_type.__name__)
        # A tuple, not the span object: the collector untracks tuples of plain values, so a
        # full buffer costs the cyclic GC nothing (a buffered object would be traversed).
        tracer._record((SPAN, self.start_ns, end_ns, self.track, self.name, self.args,
                        self.flow_out, self.flow_in))
        return False

    def set_arg(self, key: str, value: Any) -> None:
        """Attach an argument known only inside the span (e.g. the episode status); copies the
        args (never mutates the mapping passed to `Tracer.span`)."""
        self.args = {**self.args, key: value} if self.args else {key: value}


class DeviceSpan(Span):
    """A span for device work (`Tracer.device_span`) that ends when `block(x)` returns.

    Its args say `blocked=True`; without `block` it ends at `__exit__` with `blocked=False` (it
    measured only the dispatch)."""

    __slots__ = ()

    def block(self, value: Any) -> Any:
        """Block until `value` (a pytree of arrays) is computed; the span ends here."""
        value = block_until_ready(value)
        self.end_ns = self._tracer._clock()
        self.set_arg("blocked", True)
        return value


_new = object.__new__


class Tracer:
    """Records spans, instants, counters and flows; see the module docstring.

    Args:
      capacity: events the buffer holds before the oldest are dropped (and counted).
      clock: a callable returning monotonic nanoseconds (tests pass a virtual clock).
      enabled: record at all; `set_enabled(False)` turns the process tracer off.
    """

    def __init__(self, *, capacity: int = 1 << 20,
                 clock: Callable[[], int] = time.perf_counter_ns, enabled: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"Tracer capacity must be >= 1, got {capacity}")
        self.enabled, self.capacity, self._clock = enabled, capacity, clock
        self._events: deque = deque(maxlen=capacity)
        self._dropped, self._wake_at = 0, capacity  # _wake_at: events that wake the writer
        self._flow_ids = itertools.count(1)
        self._last_values: dict[str, float] = {}  # counter name -> last sample (on_change)
        self._current_track: contextvars.ContextVar = contextvars.ContextVar(
            f"agentax_trace_track_{id(self)}", default=None)
        self._tls = threading.local()
        self._writer = self._last_writer = None

    def _record(self, event: tuple) -> None:
        events = self._events
        if len(events) >= self._wake_at:
            self._full()
        events.append(event)

    def _full(self) -> None:  # the buffer holds `_wake_at` events: wake the writer, count drops
        if len(self._events) >= self.capacity:
            self._dropped += 1
        writer = self._writer
        if writer is not None and not writer._wake.is_set():
            writer._wake.set()

    def _thread_track(self) -> ThreadTrack:
        try:
            return self._tls.track
        except AttributeError:
            track = self._tls.track = ThreadTrack(threading.get_native_id(),
                                                  threading.current_thread().name)
            return track

    def current_track(self) -> Any:
        """The track a span opened here would land on (a name or the thread's track)."""
        return self._current_track.get() or self._thread_track()

    def span(self, name: str, *, track: str | None = None, args: Mapping[str, Any] | None = None,
             flow_out: Iterable[int] = (), flow_in: Iterable[int] = (),
             _kind: type = Span) -> Span | _NoopSpan:
        """A span from `__enter__` to `__exit__`.

        Args:
          name: what the span is (prefer `agentax.trace.names` constants).
          track: None for the current track (context's, else the thread's); a string names a
            custom track, which becomes the current track for everything nested inside.
          args: small key/value annotations (str, int, float, bool); not copied (the writer
            encodes it later), so do not mutate the mapping after passing it.
          flow_out: flow ids that start here (an arrow to the span that takes them in).
          flow_in: flow ids that end here.
        """
        if not self.enabled:
            return NOOP_SPAN
        span = _new(_kind)
        span._tracer = self
        span.name = name
        span.track = track
        span.args = args or None
        span.end_ns = 0
        span.flow_out = tuple(flow_out) if flow_out else ()
        span.flow_in = tuple(flow_in) if flow_in else ()
        return span

    def device_span(self, name: str = DEVICE_CALL, *, track: str | None = None,
                    args: Mapping[str, Any] | None = None) -> DeviceSpan | _NoopSpan:
        """A span for a jitted call that ends when the caller blocks on its result.

        Usage: ``with tracer.device_span(TRAIN_STEP) as ds: out = ds.block(step(state, b))``.
        Only the edge the caller chooses syncs.
        """
        return self.span(name, track=track, args={**(args or {}), "blocked": False},
                         _kind=DeviceSpan)

    def instant(self, name: str, *, track: str | None = None,
                args: Mapping[str, Any] | None = None, ts_ns: int | None = None) -> None:
        """A point event on a track."""
        if not self.enabled:
            return
        ts = self._clock() if ts_ns is None else int(ts_ns)
        self._record((INSTANT, ts, ts, track or self.current_track(), name,
                      dict(args) if args else None, (), ()))

    def counter(self, name: str, value: float, *, ts_ns: int | None = None,
                on_change: bool = False) -> None:
        """A sample of a counter (one counter track per name).

        Args:
          name: the counter (prefer `agentax.trace.names` constants).
          value: the sample.
          ts_ns: when it was taken (default: now).
          on_change: record it only if it differs from the last sample recorded for `name`
            (for gauges sampled at every state change of which most change nothing, e.g. the
            engine's slot counts; the trace shows the same step function). Leave it False for
            counters whose samples are counted (staleness: one per consumed group).
        """
        if not self.enabled:
            return
        if on_change:
            if name in self._last_values and self._last_values[name] == value:
                return
            self._last_values[name] = value
        ts = self._clock() if ts_ns is None else int(ts_ns)
        self._record((COUNTER, ts, ts, None, name, float(value), (), ()))

    def new_flow_id(self) -> int:
        """A fresh id to connect a producer span (flow_out) to a consumer span (flow_in)."""
        return next(self._flow_ids)

    @contextlib.contextmanager
    def use_track(self, track: str):
        """Make `track` the current track without opening a span (context manager)."""
        token = self._current_track.set(track)
        try:
            yield track
        finally:
            self._current_track.reset(token)

    def start(self, path: str | os.PathLike, *, flush_interval_s: float = 0.2,
              process_name: str = "agentax") -> str:
        """Write this tracer's events to a Perfetto trace file from now on.

        Never truncates: if the file exists (a resumed run), the events go to the next free
        segment, `trace.1.perfetto-trace`, `trace.2.perfetto-trace`, ...; `read_trace(run_dir)`
        and `agentax doctor` read all segments of a run.

        Args:
          path: a run directory (the file is `RUN_DIR/trace.perfetto-trace`) or a file path.
          flush_interval_s: how often the background writer drains the buffer into the file.
          process_name: the process track's name in the Perfetto UI.
        Returns:
          The path of the file written (the segment).
        """
        from agentax.trace._writer import DRAIN_AT, PerfettoWriter

        if self._writer is not None:
            raise RuntimeError(f"tracer already writes to {self._writer.path}; call close() first")
        path = os.fspath(path)
        if os.path.isdir(path) or not os.path.splitext(path)[1]:
            os.makedirs(path, exist_ok=True)
            path = os.path.join(path, TRACE_FILENAME)
        self._last_values.clear()  # a new file starts every on_change counter with a sample
        self._writer = PerfettoWriter(self, path, flush_interval_s=flush_interval_s,
                                      process_name=process_name)
        self._wake_at = min(self.capacity, DRAIN_AT)
        self.instant(HOST_INFO, track="process", args=_host_info())
        return self._writer.path

    def flush(self) -> None:
        """Write everything recorded so far (blocks until it is in the file)."""
        if self._writer is not None:
            self._writer.drain()

    def close(self) -> None:
        """Flush, stop the writer and close the file (recording continues into the buffer)."""
        writer, self._writer, self._wake_at = self._writer, None, self.capacity
        if writer is not None:
            writer.stop()
            self._last_writer = writer

    def take_events(self, limit: int | None = None) -> list[tuple]:
        """Remove and return up to `limit` (default all) buffered record tuples:
        ``(kind, start_ns, end_ns, track, name, args_or_value, flow_out, flow_in)``."""
        events, out = self._events, []
        try:
            for _ in range(len(events) if limit is None else min(limit, len(events))):
                out.append(events.popleft())
        except IndexError:  # another thread took the rest
            pass
        return out

    def stats(self) -> dict[str, int]:
        """Counts: events dropped (buffer full), buffered, written, bytes written, and the CPU
        time (ns) the writer spent encoding and writing."""
        writer = self._writer or self._last_writer
        return {"dropped": self._dropped, "buffered": len(self._events),
                "written": writer.events_written if writer else 0,
                "bytes": writer.bytes_written if writer else 0,
                "writer_cpu_ns": writer.cpu_ns if writer else 0}


def _host_info() -> dict:
    """What the doctor needs to know: the CPU cores this process may use and, if the program
    uses JAX, its backend and device count (whether engine and trainer can share cores)."""
    info = {"cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 0}
    jax = sys.modules.get("jax")  # never imported here: a program without JAX has no backend
    if jax is not None:
        try:
            info.update(jax_backend=jax.default_backend(), jax_devices=jax.device_count())
        except Exception:  # noqa: BLE001 - a broken backend is the program's to report
            pass
    return info


_TRACER = Tracer()


def get_tracer() -> Tracer:
    """The process-wide tracer (always on unless `set_enabled(False)`)."""
    return _TRACER


def set_enabled(enabled: bool) -> None:
    """Turn the process-wide tracer on or off (off: spans cost one attribute check)."""
    _TRACER.enabled = bool(enabled)


def traced(name: str | Callable | None = None, *, track: str | None = None,
           tracer: Tracer | None = None):
    """Decorator: trace every call of a sync or async function as a span.

    `@traced` uses the function's qualified name; `@traced(names.ENV_STEP)` a given one.
    The tracer is looked up at call time (default: the process tracer).
    """
    def decorate(fn: Callable) -> Callable:
        span_name = name if isinstance(name, str) else fn.__qualname__

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with (tracer or _TRACER).span(span_name, track=track):
                    return await fn(*args, **kwargs)
            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with (tracer or _TRACER).span(span_name, track=track):
                return fn(*args, **kwargs)
        return wrapper

    return decorate(name) if callable(name) and not isinstance(name, str) else decorate
