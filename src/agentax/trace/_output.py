"""The background trace writer: a thread that drains the tracer's buffer into a sink.

Two sinks write the same file. `ProcessSink` (the default) hands each batch, as plain values
in one `marshal` frame, to a low-priority encoder process (`agentax.trace._encoder_proc`), so
the traced process spends ~0.3 us per event instead of ~2.7 us encoding it. `FileSink`
encodes in this process (`writer="thread"`). If the encoder process cannot start, dies or
stops answering, `ProcessSink` logs a warning and goes on with a `FileSink`: it cuts the file
back to what the child acknowledged and encodes the unacknowledged batches itself.

Open writers are closed at interpreter exit (`atexit`), so the tail of a run is written.
"""

from __future__ import annotations

import atexit
import logging
import marshal
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections import deque

import agentax.trace._encoder_proc as proto
from agentax.trace._writer import PacketEncoder

log = logging.getLogger("agentax.trace")

WRITERS = ("process", "thread")
ENCODER_NICE = 10  # the encoder process yields the CPU to the traced program
ACK_TIMEOUT_S = 30.0  # longest wait for the encoder process before falling back
_SRC_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FileSink:
    """Encodes batches in this process and appends them to the file."""

    def __init__(self, path: str, process_name: str, *, append: bool = False,
                 uuid_space: int = 0) -> None:
        self._encoder = PacketEncoder(process_name=process_name, uuid_space=uuid_space)
        self._file = open(path, "ab" if append else "wb")
        self.events_written = 0
        self.bytes_written = 0
        self.encoder_cpu_ns = 0

    def write(self, batch: list) -> None:
        data = self._encoder.encode(batch)
        self._file.write(data)
        self.events_written += len(batch)
        self.bytes_written += len(data)

    def sync(self, wait: bool) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ProcessSink:
    """Sends batches to an encoder process; `sync(wait=True)` returns once they are written.

    Raises OSError if the process cannot be started (the caller falls back to `FileSink`).
    """

    def __init__(self, path: str, process_name: str, *, nice: int = ENCODER_NICE,
                 timeout_s: float = ACK_TIMEOUT_S) -> None:
        if not sys.executable:
            raise OSError("no Python executable to run the trace encoder with")
        self.path = path
        self._process_name = process_name
        self._timeout_s = timeout_s
        open(path, "wb").close()  # bad paths fail here, in the caller
        self._proc = subprocess.Popen(
            [sys.executable, "-c", proto.BOOTSTRAP, _SRC_ROOT, path, str(os.getpid()),
             process_name, str(nice)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        self._in_fd = self._proc.stdin.fileno()
        self._ack_fd = self._proc.stdout.fileno()
        os.set_blocking(self._in_fd, False)
        os.set_blocking(self._ack_fd, False)
        self._unacked: deque = deque()  # (frame, events) sent, not yet acknowledged
        self._sent = self._acked = 0
        self._ack_buf = b""
        self._fallback: FileSink | None = None
        self._acked_events = self._acked_bytes = self.encoder_cpu_ns = 0
        self._ready = False
        try:  # wait until it has imported the encoder: a child that cannot start fails here
            deadline = time.monotonic() + timeout_s
            while not self._ready:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not ready in {timeout_s:.0f} s")
                self._read_acks(max(0.0, deadline - time.monotonic()))
        except OSError as err:
            self._end_process()
            raise OSError(f"the encoder process did not start ({err})") from err

    # -- counts -----------------------------------------------------------------------------
    @property
    def events_written(self) -> int:
        return self._acked_events + (self._fallback.events_written if self._fallback else 0)

    @property
    def bytes_written(self) -> int:
        return self._acked_bytes + (self._fallback.bytes_written if self._fallback else 0)

    # -- the sink ---------------------------------------------------------------------------
    def write(self, batch: list) -> None:
        if self._fallback is not None:
            self._fallback.write(batch)
            return
        frame = proto.dumps(batch)
        self._unacked.append((frame, len(batch)))
        self._sent += 1
        try:
            self._send(frame)
        except OSError as err:  # BrokenPipeError: the encoder died; TimeoutError: it hangs
            self._fail(f"could not send to the trace encoder process ({err!r})")

    def sync(self, wait: bool) -> None:
        if self._fallback is not None:
            self._fallback.sync(wait)
            return
        deadline = time.monotonic() + self._timeout_s
        try:
            self._read_acks(0.0)
            while wait and self._acked < self._sent:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer in {self._timeout_s:.0f} s")
                self._read_acks(left)
        except OSError as err:
            self._fail(f"the trace encoder process failed ({err!r})")
            self._fallback.sync(wait)

    def close(self) -> None:
        self.sync(wait=True)
        if self._fallback is not None:
            self._fallback.close()
            return
        self._proc.stdin.close()  # end of input: the encoder exits
        try:
            code = self._proc.wait(timeout=self._timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        self._proc.stdout.close()
        if code:
            log.warning("agentax.trace: the trace encoder process exited with %s after "
                        "writing everything", code)

    # -- internals --------------------------------------------------------------------------
    def _send(self, frame: bytes) -> None:
        view = memoryview(frame)
        while view:
            try:
                view = view[os.write(self._in_fd, view):]
                continue
            except BlockingIOError:
                pass
            self._read_acks(0.0)  # the encoder is behind: take what it finished meanwhile
            if not select.select([], [self._in_fd], [], self._timeout_s)[1]:
                raise TimeoutError(f"the encoder took no input for {self._timeout_s:.0f} s")

    def _read_acks(self, timeout: float) -> None:
        """Take the acknowledgements that arrive within `timeout` seconds (0: those waiting)."""
        if not select.select([self._ack_fd], [], [], timeout)[0]:
            return
        try:
            data = os.read(self._ack_fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            raise BrokenPipeError(f"the encoder exited ({self._proc.poll()})")
        buf = self._ack_buf + data
        size = proto.ACK.size
        whole = len(buf) - len(buf) % size
        for offset in range(0, whole, size):
            done, file_size, cpu_ns = proto.ACK.unpack_from(buf, offset)
            while self._acked < done:
                self._acked_events += self._unacked.popleft()[1]
                self._acked += 1
            self._acked_bytes, self.encoder_cpu_ns = file_size, cpu_ns
            self._ready = True
        self._ack_buf = buf[whole:]

    def _fail(self, reason: str) -> None:
        """Go on in this process: keep what the child acknowledged, encode the rest here."""
        log.warning("agentax.trace: %s; encoding in the traced process from now on "
                    "(tracing costs more CPU there)", reason)
        self._end_process()
        with open(self.path, "r+b") as f:  # drop a batch the child wrote but did not acknowledge
            f.truncate(self._acked_bytes)
        # Its own track uuids: the child's descriptors stay in the file and must not clash.
        self._fallback = FileSink(self.path, self._process_name, append=True, uuid_space=1)
        while self._unacked:
            frame, _ = self._unacked.popleft()
            self._fallback.write(proto.from_plain(marshal.loads(frame[proto.FRAME.size:])))

    def _end_process(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def open_sink(path: str, process_name: str, writer: str) -> FileSink | ProcessSink:
    """The sink for `Tracer.start(writer=...)`; "process" falls back to a thread if it must."""
    if writer not in WRITERS:
        raise ValueError(f"unknown trace writer {writer!r}; use one of {WRITERS}")
    if writer == "process":
        try:
            return ProcessSink(path, process_name, nice=ENCODER_NICE)
        except OSError as err:
            if not os.path.isdir(os.path.dirname(path) or "."):
                raise
            log.warning("agentax.trace: cannot start the trace encoder process (%r); encoding "
                        "in the traced process", err)
    return FileSink(path, process_name)


_OPEN_WRITERS: "weakref.WeakSet[PerfettoWriter]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for writer in list(_OPEN_WRITERS):
        try:
            writer.stop()
        except Exception as err:  # an exiting program must not fail for its trace
            print(f"agentax.trace: could not finish {writer.path}: {err!r}", file=sys.stderr)


class PerfettoWriter:
    """A daemon thread that drains a tracer into a sink (see the module docstring).

    It wakes every `flush_interval_s`, but writes only when `min_batch` events are waiting or
    `max_interval_s` passed since its last write. Encoding in this process (the "thread"
    writer) costs a fixed part per batch (a `Trace` header), so there few large batches (4096
    events) take the least CPU (and GIL) from the threads doing the real work; the "process"
    writer hands over whatever is waiting at every wake-up. `drain()` (`Tracer.flush`) writes
    everything at once. Batches hold at most `max_batch` events, with a GIL handover between.
    """

    def __init__(self, tracer, path: str, *, flush_interval_s: float = 0.2,
                 process_name: str = "agentax", writer: str = "process", max_batch: int = 8192,
                 min_batch: int | None = None, max_interval_s: float | None = None) -> None:
        self.path = path
        self._tracer = tracer
        self._interval = flush_interval_s
        self._max_interval = max(flush_interval_s, 2.0) if max_interval_s is None \
            else max_interval_s
        self._max_batch = max_batch
        self._sink = open_sink(path, process_name, writer)
        # Encoding here costs a fixed part per batch, so the thread waits for large ones;
        # handing a batch to the encoder process costs little, so it goes at every wake-up
        # and close() waits only for the last `flush_interval_s` of events to be encoded.
        if min_batch is None:
            min_batch = 1 if isinstance(self._sink, ProcessSink) else 4096
        self._min_batch = min_batch
        self._owner = os.getpid()  # a forked child must not write into our sink
        self._closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentax-trace-writer",
                                        daemon=True)

    @property
    def writer(self) -> str:
        """What encodes now: "process", or "thread" (chosen, or fallen back to)."""
        sink = self._sink
        return "process" if isinstance(sink, ProcessSink) and sink._fallback is None \
            else "thread"

    @property
    def events_written(self) -> int:
        return self._sink.events_written

    @property
    def bytes_written(self) -> int:
        return self._sink.bytes_written

    @property
    def encoder_cpu_ns(self) -> int:
        """CPU time of the encoder process so far (as of its last acknowledgement)."""
        return self._sink.encoder_cpu_ns

    def start(self) -> None:
        _OPEN_WRITERS.add(self)
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._interval):
            if (len(self._tracer._events) < self._min_batch
                    and time.monotonic() - last < self._max_interval):
                continue
            try:
                self.drain(yield_between=True, wait=False)
            except Exception as err:  # never kill the run for a trace; say so once
                print(f"agentax.trace: writer failed, tracing to {self.path} stops: {err!r}",
                      file=sys.stderr)
                return
            last = time.monotonic()

    def drain(self, *, yield_between: bool = False, wait: bool = True) -> None:
        """Write everything buffered now; with `wait`, return once it is in the file."""
        with self._lock:
            if self._closed or os.getpid() != self._owner:
                return
            pending = len(self._tracer._events)
            while pending > 0:
                batch = self._tracer._pop_events(min(pending, self._max_batch))
                if not batch:
                    break
                pending -= len(batch)
                self._sink.write(batch)
                if yield_between and pending > 0:
                    time.sleep(0)  # hand the GIL to the threads doing the real work
            self._sink.sync(wait)

    def stop(self) -> None:
        """Write what is buffered, stop the thread and close the sink (idempotent)."""
        if os.getpid() != self._owner:
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self.drain()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._sink.close()
        _OPEN_WRITERS.discard(self)
