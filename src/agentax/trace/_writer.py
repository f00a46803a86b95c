"""Background writer: drains the tracer's buffer and appends Perfetto packets to a file.

Each drain encodes only the new events (a `Trace` message of new `TracePacket`s; concatenated
`Trace` messages form one valid trace), so the cost of writing does not grow with run length.
Names are interned once per trace (`InternedData.event_names`), tracks are described the first
time they are used.

Spans are recorded when they end, so children reach the writer before their parents. Spans of
one track that do not nest (two coroutines sharing a thread's track) are moved to numbered
lane tracks under it, so the trace never holds a malformed slice stack.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
import threading
from operator import itemgetter
from typing import Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from agentax.trace._tracer import COUNTER, INSTANT, SPAN, ThreadTrack

SEQUENCE_ID = 0x4A58  # trusted_packet_sequence_id of every packet we write
_BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
_END = pb.TrackEvent.TYPE_SLICE_END
_INSTANT = pb.TrackEvent.TYPE_INSTANT
_COUNTER = pb.TrackEvent.TYPE_COUNTER
_CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_NEEDS = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_SLACK_NS = 64  # a parent whose start ties a child's is written this much earlier at most
_MAX_ROOTS = 512  # top-level spans remembered per lane (bounds writer memory)
LANE_SEPARATOR = " ["  # lane k>0 of track "T" is named "T [k]"


class _Lane:
    """Top-level spans of one lane: disjoint, sorted by start (for nesting checks)."""

    __slots__ = ("starts", "ends", "origins")

    def __init__(self) -> None:
        self.starts: list[int] = []  # start as written (a parent may be moved a few ns early)
        self.ends: list[int] = []
        self.origins: list[int] = []  # start as recorded

    def place(self, start: int, end: int) -> int | None:
        """Place [start, end] if it nests with what is here; returns the start to write."""
        starts, ends, origins = self.starts, self.ends, self.origins
        i = bisect.bisect_left(starts, start - _SLACK_NS)
        if i > 0 and ends[i - 1] > start:
            return None  # overlaps the end of an earlier span without containing it
        while i < len(starts) and origins[i] < start:
            if ends[i] > start:
                return None
            i += 1  # an earlier sibling that ended before we started
        j = bisect.bisect_left(starts, end + 1, lo=i)
        if j > i and ends[j - 1] > end:
            return None  # a later span sticks out past our end
        written = start
        if j > i and starts[i] <= start:
            written = max(0, starts[i] - 1)  # tie with a child already written: begin just before it
        starts[i:j] = [written]
        ends[i:j] = [end]
        origins[i:j] = [start]
        if len(starts) > 2 * _MAX_ROOTS:
            del starts[:_MAX_ROOTS], ends[:_MAX_ROOTS], origins[:_MAX_ROOTS]
        return written


def _annotate(event: pb.TrackEvent, args: dict, name_iid) -> None:
    for key, value in args.items():
        ann = event.debug_annotations.add()
        ann.name_iid = name_iid(key)
        if isinstance(value, bool):
            ann.bool_value = value
        elif isinstance(value, int):
            ann.int_value = value
        elif isinstance(value, float):
            ann.double_value = value
        elif isinstance(value, str):
            ann.string_value = value
        else:
            try:
                ann.string_value = json.dumps(value, default=str)
            except (TypeError, ValueError):
                ann.string_value = repr(value)


class PacketEncoder:
    """Turns buffered tracer events into serialized `Trace` bytes, keeping per-trace state."""

    def __init__(self, *, pid: int | None = None, process_name: str = "agentax") -> None:
        self.pid = os.getpid() if pid is None else pid
        self.process_name = process_name
        self._next_uuid = (self.pid & 0xFFFF) << 32 | 1
        self._tracks: dict[Any, int] = {}  # (track, lane) | ("counter", name) -> uuid
        self._groups: dict[str, int] = {}
        self._lanes: dict[Any, list[_Lane]] = {}
        self._event_names: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._process_uuid = 0
        self._trace: pb.Trace | None = None
        self._interned: pb.InternedData | None = None

    # -- interning / descriptors -----------------------------------------------------------
    def _uuid(self) -> int:
        self._next_uuid += 1
        return self._next_uuid

    def _packet(self) -> pb.TracePacket:
        packet = self._trace.packet.add()
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        return packet

    def _name_iid(self, name: str) -> int:
        iid = self._event_names.get(name)
        if iid is None:
            iid = self._event_names[name] = len(self._event_names) + 1
            self._interned.event_names.add(iid=iid, name=name)
        return iid

    def _arg_iid(self, name: str) -> int:
        iid = self._arg_names.get(name)
        if iid is None:
            iid = self._arg_names[name] = len(self._arg_names) + 1
            self._interned.debug_annotation_names.add(iid=iid, name=name)
        return iid

    def _describe(self, uuid: int, *, name: str | None = None, parent: int | None = None,
                  thread: ThreadTrack | None = None, counter: bool = False) -> None:
        desc = self._packet().track_descriptor
        desc.uuid = uuid
        if parent:
            desc.parent_uuid = parent
        if thread is not None:
            desc.thread.pid = self.pid
            desc.thread.tid = thread.tid
            desc.thread.thread_name = thread.name
        if name is not None:
            desc.name = name
        if counter:
            desc.counter.SetInParent()

    def _track_uuid(self, track: Any, lane: int) -> int:
        uuid = self._tracks.get((track, lane))
        if uuid is not None:
            return uuid
        uuid = self._tracks[(track, lane)] = self._uuid()
        if lane:
            base = self._track_uuid(track, 0)
            label = f"{track.name} ({track.tid})" if isinstance(track, ThreadTrack) else track
            self._describe(uuid, name=f"{label}{LANE_SEPARATOR}{lane}]", parent=base)
        elif isinstance(track, ThreadTrack):
            self._describe(uuid, parent=self._process_uuid, thread=track)
        else:
            name = str(track)
            group, sep, _ = name.partition("/")
            parent = self._process_uuid
            if sep and group:
                parent = self._groups.get(group)
                if parent is None:
                    parent = self._groups[group] = self._uuid()
                    self._describe(parent, name=group, parent=self._process_uuid)
            self._describe(uuid, name=name, parent=parent)
        return uuid

    def _counter_uuid(self, name: str) -> int:
        key = ("counter", name)
        uuid = self._tracks.get(key)
        if uuid is None:
            uuid = self._tracks[key] = self._uuid()
            self._describe(uuid, name=name, parent=self._process_uuid, counter=True)
        return uuid

    def _place(self, track: Any, start: int, end: int) -> tuple[int, int]:
        lanes = self._lanes.setdefault(track, [])
        for lane_index, lane in enumerate(lanes):
            placed = lane.place(start, end)
            if placed is not None:
                return lane_index, placed
        lane = _Lane()
        lanes.append(lane)
        return len(lanes) - 1, lane.place(start, end)

    # -- encoding ---------------------------------------------------------------------------
    def encode(self, events: list[tuple]) -> bytes:
        """Serialize `events` (tracer records) as `Trace` bytes to append to the file."""
        self._trace = pb.Trace()
        header = self._packet()
        self._interned = header.interned_data
        if not self._process_uuid:
            header.sequence_flags = _CLEARED
            self._process_uuid = self._uuid()
            desc = header.track_descriptor
            desc.uuid = self._process_uuid
            desc.process.pid = self.pid
            desc.process.process_name = self.process_name
        else:
            header.sequence_flags = _NEEDS
        # Children end before parents; ties: the inner (later-starting) span first.
        events.sort(key=lambda e: (e[2], -e[1]))
        for kind, start, end, track, name, payload, flow_out, flow_in in events:
            if kind == SPAN:
                lane, start = self._place(track, start, end)
                uuid = self._track_uuid(track, lane)
                packet = self._packet()
                packet.timestamp = start
                packet.sequence_flags = _NEEDS
                ev = packet.track_event
                ev.type = _BEGIN
                ev.track_uuid = uuid
                ev.name_iid = self._name_iid(name)
                if payload:
                    _annotate(ev, payload, self._arg_iid)
                if flow_out:
                    ev.flow_ids.extend(flow_out)
                if flow_in:
                    ev.terminating_flow_ids.extend(flow_in)
                packet = self._packet()
                packet.timestamp = end
                packet.sequence_flags = _NEEDS
                packet.track_event.type = _END
                packet.track_event.track_uuid = uuid
            elif kind == INSTANT:
                uuid = self._track_uuid(track, 0)
                packet = self._packet()
                packet.timestamp = start
                packet.sequence_flags = _NEEDS
                ev = packet.track_event
                ev.type = _INSTANT
                ev.track_uuid = uuid
                ev.name_iid = self._name_iid(name)
                if payload:
                    _annotate(ev, payload, self._arg_iid)
            elif kind == COUNTER:
                uuid = self._counter_uuid(name)
                packet = self._packet()
                packet.timestamp = start
                packet.track_event.type = _COUNTER
                packet.track_event.track_uuid = uuid
                packet.track_event.double_counter_value = payload
        data = self._trace.SerializeToString()
        self._trace = self._interned = None
        return data


class PerfettoWriter:
    """A daemon thread that drains a tracer every `flush_interval_s` and appends to `path`."""

    def __init__(self, tracer, path: str, *, flush_interval_s: float = 0.2,
                 process_name: str = "agentax", max_batch: int = 50_000) -> None:
        self.path = path
        self.events_written = 0
        self.bytes_written = 0
        self._tracer = tracer
        self._interval = flush_interval_s
        self._max_batch = max_batch
        self._encoder = PacketEncoder(process_name=process_name)
        self._file = open(path, "wb")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentax-trace-writer",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.drain()
            except Exception as err:  # never kill the run for a trace; say so once
                print(f"agentax.trace: writer failed, tracing to {self.path} stops: {err!r}",
                      file=sys.stderr)
                return

    def drain(self) -> None:
        """Encode and append everything buffered now."""
        with self._lock:
            if self._file.closed:
                return
            events = self._tracer._events
            while events:
                batch = []
                pop = events.popleft
                try:
                    for _ in range(min(len(events), self._max_batch)):
                        batch.append(pop())
                except IndexError:
                    pass
                if not batch:
                    break
                data = self._encoder.encode(batch)
                self._file.write(data)
                self.events_written += len(batch)
                self.bytes_written += len(data)
            self._file.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self.drain()
        with self._lock:
            self._file.close()
