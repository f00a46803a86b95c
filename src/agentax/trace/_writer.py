"""The trace writer: a background thread that appends the tracer's events to a Perfetto file.

Every drain appends `Trace` messages built with perfetto's generated protos (concatenated ones
are one valid trace), so writing costs the same at hour ten as at minute one and a killed run
leaves a readable file. Names are written in full (no interning, no incremental state); a track
is described when first used. Spans arrive when they end (children first); spans of one track
that do not nest (coroutines sharing a thread's track) go to lane tracks under it ("T [1]"), so
the file never holds a malformed slice stack. An existing file is never truncated: the writer
takes the next free segment (`segment_path`); track uuids are random per segment.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import sys
import threading
import time
import weakref
from typing import Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from agentax.trace._tracer import COUNTER, SPAN, ThreadTrack

SEQUENCE_ID = 0x4A58  # trusted_packet_sequence_id of every packet we write
LANE_SEPARATOR = " ["  # lane k > 0 of track "T" is named "T [k]"
_BEGIN, _END = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END
_MAX_ROOTS = 512  # top-level spans remembered per lane (bounds the writer's memory)
_MAX_TRACKS = 4096  # tracks whose lanes are remembered (least recently used forgotten)
_CHUNK = 64  # events encoded between two GIL hand-overs (~0.2 ms of encoding)
_PAUSE_S = 1e-4  # the background drain's pause between chunks
DRAIN_AT = 128  # buffered events that wake the writer before its interval is up (64: more CPU)


def segment_path(path: str, index: int) -> str:
    """Segment `index` of a trace file: 0 is `path`, k > 0 is ``trace.k.perfetto-trace``."""
    stem, ext = os.path.splitext(path)
    return path if index == 0 else f"{stem}.{index}{ext}"


def _place(roots: list, start: int, end: int) -> int | None:
    """Put [start, end] on a lane with top-level spans `roots` ([written, origin, end], sorted);
    the start to write, or None if it does not nest there (its children stop being roots)."""
    i = len(roots)
    while i and roots[i - 1][2] > start:
        _, origin, root_end = roots[i - 1]
        if origin < start or root_end > end:
            return None  # overlaps without containing it
        i -= 1
    written = start
    if i < len(roots) and roots[i][0] <= start:  # a child starts on the same ns: begin first
        written = roots[i][0] - 1
    roots[i:] = [(written, start, end)]  # tuples: the GC stops scanning them
    if len(roots) > 2 * _MAX_ROOTS:
        del roots[:_MAX_ROOTS]
    return written


def _annotate(event: pb.TrackEvent, args: dict) -> None:
    for key, value in args.items():
        ann = event.debug_annotations.add(name=key)
        if isinstance(value, bool):
            ann.bool_value = value
        elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
            ann.int_value = value
        elif isinstance(value, float):
            ann.double_value = value
        elif isinstance(value, str):
            ann.string_value = value
        else:
            try:
                ann.string_value = json.dumps(value, default=str)
            except (TypeError, ValueError):  # e.g. a dict with tuple keys
                ann.string_value = repr(value)


class PacketEncoder:
    """Turns buffered record tuples into `Trace` bytes; keeps the track state of one file."""

    def __init__(self, process_name: str = "agentax", pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._next_uuid = random.getrandbits(62) << 1  # unique across segments and processes
        self._tracks: dict[tuple[Any, int], int] = {}
        self._lanes: dict[Any, list] = {}  # track -> lanes, least recently used first
        self._out = pb.Trace()
        self._process_uuid = self._describe(0, process=process_name)

    def _describe(self, parent: int, name: str = "", *, thread: ThreadTrack | None = None,
                  process: str | None = None, counter: bool = False) -> int:
        """Add a descriptor of a new track under `parent` to the message being built."""
        self._next_uuid = (self._next_uuid + 1) & ((1 << 63) - 1)
        desc = self._out.packet.add(trusted_packet_sequence_id=SEQUENCE_ID).track_descriptor
        desc.uuid = self._next_uuid
        if parent:
            desc.parent_uuid = parent
        if thread is not None:
            desc.thread.pid, desc.thread.tid, desc.thread.thread_name = self.pid, *thread
        elif process is not None:
            desc.process.pid, desc.process.process_name = self.pid, process
        else:
            desc.name = name
        if counter:
            desc.counter.SetInParent()
        return self._next_uuid

    def _track_uuid(self, track: Any, lane: int = 0) -> int:
        """The uuid of a span track's lane, or (lane -1) of the counter named `track`."""
        uuid = self._tracks.get((track, lane))
        if uuid is None:
            root = self._process_uuid
            if lane < 0:
                uuid = self._describe(root, track, counter=True)
            elif lane:
                label = f"{track.name} ({track.tid})" if isinstance(track, ThreadTrack) else track
                uuid = self._describe(self._track_uuid(track), f"{label}{LANE_SEPARATOR}{lane}]")
            elif isinstance(track, ThreadTrack):
                uuid = self._describe(root, thread=track)
            else:  # "episode/17" is grouped under a track "episode"
                group, sep, _ = str(track).partition("/")
                parent = self._track_uuid(group) if sep and group else root
                uuid = self._describe(parent, str(track))
            self._tracks[(track, lane)] = uuid
        return uuid

    def _lane(self, track: Any, start: int, end: int) -> tuple[int, int]:
        # An episode track is used once: forgetting idle ones keeps memory flat over a long run.
        lanes = self._lanes.pop(track, None) or []
        self._lanes[track] = lanes
        if len(self._lanes) > _MAX_TRACKS:  # used again later, it is described anew
            old = next(iter(self._lanes))
            for lane in range(len(self._lanes.pop(old))):
                self._tracks.pop((old, lane), None)
        for index, roots in enumerate(lanes):
            written = _place(roots, start, end)
            if written is not None:
                return index, written
        lanes.append([(start, start, end)])
        return len(lanes) - 1, start

    def encode(self, events: list) -> bytes:
        """`Trace` bytes of `events` (record tuples), to append to the file. Track descriptors
        go before the events that use them, in the same message."""
        out = self._out
        add = out.packet.add
        # Children end before their parents; on a tie the inner (later-starting) span first.
        for kind, start, end, track, name, payload, flow_out, flow_in in sorted(
                events, key=lambda e: (e[2], -e[1])):
            if kind == COUNTER:
                uuid = self._track_uuid(name, -1)
                ev = add(timestamp=start, trusted_packet_sequence_id=SEQUENCE_ID).track_event
                ev.type, ev.track_uuid = pb.TrackEvent.TYPE_COUNTER, uuid
                ev.double_counter_value = payload
                continue
            lane, start = self._lane(track, start, end) if kind == SPAN else (0, start)
            uuid = self._track_uuid(track, lane)
            ev = add(timestamp=start, trusted_packet_sequence_id=SEQUENCE_ID).track_event
            ev.type = _BEGIN if kind == SPAN else pb.TrackEvent.TYPE_INSTANT
            ev.track_uuid, ev.name = uuid, name
            if payload:
                _annotate(ev, payload)
            if flow_out:
                ev.flow_ids.extend(flow_out)
            if flow_in:
                ev.terminating_flow_ids.extend(flow_in)
            if kind == SPAN:
                ev = add(timestamp=end, trusted_packet_sequence_id=SEQUENCE_ID).track_event
                ev.type, ev.track_uuid = _END, uuid
        self._out = pb.Trace()
        return out.SerializeToString()


_OPEN: "weakref.WeakSet[PerfettoWriter]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for writer in list(_OPEN):
        try:
            writer.stop()
        except Exception as err:  # an exiting program must not fail for its trace
            print(f"agentax.trace: could not finish {writer.path}: {err!r}", file=sys.stderr)


class PerfettoWriter:
    """A daemon thread that drains a tracer into the first free segment of `path` every
    `flush_interval_s`, or once `DRAIN_AT` events wait (encoding in the background overlaps
    the run's waits; what `stop` finds is encoded on the caller's critical path). Stopped at
    interpreter exit (the tail is written); a forked child never writes."""

    def __init__(self, tracer, path: str, *, flush_interval_s: float = 0.2,
                 process_name: str = "agentax") -> None:
        index = 0
        while os.path.exists(segment_path(path, index)):
            index += 1
        self.path = segment_path(path, index)
        self._file = open(self.path, "xb", buffering=0)  # never truncates; a write per drain
        self._tracer, self._interval = tracer, flush_interval_s
        self._encoder = PacketEncoder(process_name)
        self.events_written = self.bytes_written = self.cpu_ns = 0
        self._owner, self._closed, self._stopping = os.getpid(), False, False
        self._lock, self._wake = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentax-trace-writer",
                                        daemon=True)
        _OPEN.add(self)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:  # woken by the interval, `Tracer._full` or `stop`
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.drain(pause_s=_PAUSE_S)
            except Exception as err:  # never kill the run for a trace; say so once
                print(f"agentax.trace: writer failed, tracing to {self.path} stops: {err!r}",
                      file=sys.stderr)
                return

    def drain(self, pause_s: float = 0.0) -> None:
        """Write everything buffered now, `_CHUNK` events at a time with a `pause_s` sleep
        between chunks, so a thread waiting for the GIL gets it within a chunk, not after the
        drain or the 5 ms switch interval (`sleep(0)` often takes the GIL straight back)."""
        with self._lock:
            if self._closed or os.getpid() != self._owner:
                return
            cpu, parts = time.thread_time_ns(), []
            for chunk in range(-(-len(self._tracer._events) // _CHUNK)):
                if chunk and pause_s:  # not when closing: sleep(0) would still hand the GIL over
                    time.sleep(pause_s)
                batch = self._tracer.take_events(_CHUNK)
                parts.append(self._encoder.encode(batch))
                self.events_written += len(batch)
            data = memoryview(b"".join(parts))  # one system call (a GIL hand-over)
            self.bytes_written += len(data)
            while data:
                data = data[self._file.write(data):]
            self.cpu_ns += time.thread_time_ns() - cpu

    def stop(self) -> None:
        """Write what is buffered, close the file and stop the thread (idempotent). The tail is
        encoded on the caller's thread: handing it to the writer and joining cost more."""
        if os.getpid() != self._owner:
            return
        self._stopping = True
        self.drain()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._file.close()
        self._wake.set()  # the thread finds `_stopping` set and ends
        _OPEN.discard(self)
