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
import struct
import sys
import threading
import time
from operator import itemgetter
from typing import Any

import numpy as np
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
        if not starts or (ends[-1] <= start and origins[-1] < start):  # after all: append
            starts.append(start)
            ends.append(end)
            origins.append(start)
            if len(starts) > 2 * _MAX_ROOTS:
                del starts[:_MAX_ROOTS], ends[:_MAX_ROOTS], origins[:_MAX_ROOTS]
            return start
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
        elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
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


_COUNTER_ZERO = struct.pack("<d", 0.0)
# Track uuids all lie in [2**62, 2**63): their varints are 9 bytes, so a template (a packet
# without its track uuid) has one byte layout for every track.
_UUID_BASE = 1 << 62
_UUID_PLACEHOLDERS = (_UUID_BASE, (1 << 63) - 1)
_UUID_BYTES = 9
_UUID_MARK = bytes([11 << 3]) + b"\x80" * 8 + b"\x40"  # TrackEvent.track_uuid = 2**62
_MAX_TEMPLATES = 4096  # distinct arg/flow templates cached before the cache is reset


def _varint_nbytes(values: np.ndarray) -> np.ndarray:
    """Bytes of the base-128 varint of each uint64 (1..10)."""
    nbytes = np.ones(values.shape, dtype=np.int64)
    for k in range(1, 10):
        nbytes += values >= np.uint64(1 << (7 * k))
    return nbytes


_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)  # 10 groups of 7 bits cover a uint64
_COLUMNS = np.arange(10)


def _put_varints(out: np.ndarray, pos: np.ndarray, values: np.ndarray,
                 nbytes: np.ndarray | int) -> None:
    """Write varint(values[i]) at out[pos[i]:pos[i] + nbytes[i]] (vectorized)."""
    width = int(nbytes if isinstance(nbytes, int) else nbytes.max(initial=1))
    groups = ((values[:, None] >> _SHIFTS[:width]) & np.uint64(0x7F)).astype(np.uint8)
    last = (nbytes if isinstance(nbytes, int) else nbytes[:, None]) - 1
    groups |= np.where(_COLUMNS[:width] < last, 0x80, 0).astype(np.uint8)
    where = pos[:, None] + _COLUMNS[:width]
    if isinstance(nbytes, int):
        out[where] = groups
    else:
        keep = _COLUMNS[:width] <= last
        out[where[keep]] = groups[keep]


def _ragged_copy(out: np.ndarray, dst: np.ndarray, src_buf: np.ndarray, src: np.ndarray,
                 lens: np.ndarray) -> None:
    """out[dst[i]:dst[i] + lens[i]] = src_buf[src[i]:src[i] + lens[i]] for every i."""
    total = int(lens.sum())
    if not total:
        return
    within = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
    out[np.repeat(dst, lens) + within] = src_buf[np.repeat(src, lens) + within]


class PacketEncoder:
    """Turns buffered tracer events into serialized `Trace` bytes, keeping per-trace state.

    Every packet is made by the perfetto protos (generated classes): descriptors and interned
    names as messages; an event packet as a *template* -- the `TracePacket` serialized by the
    protos without its timestamp (and, for a counter, without the value) -- cached per
    (event type, track, name[, args, flows]). Per event only the timestamp (and counter value)
    differ, so a batch is assembled from `(template, timestamp, value)` rows with numpy:
    the `Trace.packet` key and length, the `TracePacket.timestamp` key and varint, the
    template, and the counter's little-endian double. `encode(..., reference=True)` builds
    the same packets with the generated classes instead (tests check both give equal bytes).
    """

    def __init__(self, *, pid: int | None = None, process_name: str = "agentax") -> None:
        self.pid = os.getpid() if pid is None else pid
        self.process_name = process_name
        self._next_uuid = _UUID_BASE | (self.pid & 0xFFFF) << 32 | 1
        self._tracks: dict[Any, int] = {}  # (track, lane) | ("counter", name) -> uuid
        self._groups: dict[str, int] = {}
        self._lanes: dict[Any, list[_Lane]] = {}
        self._event_names: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._process_uuid = 0
        self._desc: pb.Trace | None = None
        self._interned: pb.InternedData | None = None
        self._reset_templates()

    # -- interning / descriptors -----------------------------------------------------------
    def _uuid(self) -> int:
        self._next_uuid += 1
        return self._next_uuid

    def _packet(self) -> pb.TracePacket:
        packet = self._desc.packet.add()
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
        lanes = self._lanes.get(track)
        if lanes is None:
            lanes = self._lanes[track] = [_Lane()]
        placed = lanes[0].place(start, end)
        if placed is not None:
            return 0, placed
        for lane_index, lane in enumerate(lanes):
            placed = lane.place(start, end)
            if placed is not None:
                return lane_index, placed
        lane = _Lane()
        lanes.append(lane)
        return len(lanes) - 1, lane.place(start, end)

    # -- templates --------------------------------------------------------------------------
    def _template(self, kind: int, name: str | None, args: dict | None = None,
                  flow_out: tuple = (), flow_in: tuple = ()) -> int:
        """Index of a new template: the event packet serialized by the protos, split around the
        track uuid (and, for a counter, without the value)."""
        packet = pb.TracePacket(trusted_packet_sequence_id=SEQUENCE_ID)
        ev = packet.track_event
        ev.type = kind
        if kind == _COUNTER:
            ev.double_counter_value = 0.0
        else:
            packet.sequence_flags = _NEEDS
            if name is not None:
                ev.name_iid = self._name_iid(name)
            if args:
                _annotate(ev, args, self._arg_iid)
            if flow_out:
                ev.flow_ids.extend(flow_out)
            if flow_in:
                ev.terminating_flow_ids.extend(flow_in)
        ev.track_uuid = _UUID_PLACEHOLDERS[0]
        a = packet.SerializeToString()
        at = a.find(_UUID_MARK) + 1  # where the uuid varint starts
        if at == 0 or a.find(_UUID_MARK, at) != -1:  # ambiguous: find it by a second placeholder
            ev.track_uuid = _UUID_PLACEHOLDERS[1]
            b = packet.SerializeToString()
            at = next(i for i in range(len(a)) if a[i] != b[i])
            if len(a) != len(b) or a[at + _UUID_BYTES:] != b[at + _UUID_BYTES:]:
                raise AssertionError("track uuid placeholders serialized to different lengths")
        prefix, suffix = a[:at], a[at + _UUID_BYTES:]
        if kind == _COUNTER:  # the value is the packet's last field: 8 value bytes follow
            if not suffix.endswith(_COUNTER_ZERO):
                raise AssertionError("counter value is not the last field of its packet")
            suffix = suffix[:-8]
        self._template_full.append(a)
        self._template_prefix.append(prefix)
        self._template_suffix.append(suffix)
        self._template_kinds.append(kind == _COUNTER)
        return len(self._template_full) - 1

    def _cached(self, key: Any, kind: int, name: str | None, args: dict | None = None,
                flow_out: tuple = (), flow_in: tuple = ()) -> int:
        templates = self._templates
        try:
            tid = templates.get(key)
        except TypeError:  # an unhashable arg value: build one for this event only
            return self._template(kind, name, args, flow_out, flow_in)
        if tid is None:
            tid = templates[key] = self._template(kind, name, args, flow_out, flow_in)
        return tid

    def _sync_templates(self) -> None:
        """Append the templates made since the last batch to the numpy copies."""
        done, count = len(self._template_counter), len(self._template_full)
        if done == count:
            return
        self._template_counter = np.concatenate(
            [self._template_counter, np.array(self._template_kinds[done:], dtype=np.int64)])
        for part in ("prefix", "suffix"):
            chunks = getattr(self, f"_template_{part}")[done:]
            lens = np.array([len(c) for c in chunks], dtype=np.int64)
            old_buf, old_len = getattr(self, f"_{part}_buf"), getattr(self, f"_{part}_len")
            setattr(self, f"_{part}_off", np.concatenate(
                [getattr(self, f"_{part}_off"), len(old_buf) + np.cumsum(lens) - lens]))
            setattr(self, f"_{part}_len", np.concatenate([old_len, lens]))
            setattr(self, f"_{part}_buf", np.concatenate(
                [old_buf, np.frombuffer(b"".join(chunks), dtype=np.uint8)]))

    def _reset_templates(self) -> None:
        self._templates = {}
        self._template_full = []
        self._template_prefix = []
        self._template_suffix = []
        self._template_kinds = []
        self._template_counter = np.zeros(0, dtype=np.int64)
        for part in ("prefix", "suffix"):
            for field in ("buf", "off", "len"):
                setattr(self, f"_{part}_{field}",
                        np.zeros(0, dtype=np.uint8 if field == "buf" else np.int64))

    # -- encoding ---------------------------------------------------------------------------
    def encode(self, events: list, *, reference: bool = False) -> bytes:
        """Serialize `events` (buffer entries: record tuples or finished `Span`s) as `Trace`
        bytes to append to the file. `reference=True` assembles the event packets with the
        generated protobuf classes instead of the template fast path (same bytes, slower)."""
        if len(self._template_full) > _MAX_TEMPLATES:
            self._reset_templates()
        self._desc = pb.Trace()
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
        rows = [e.record() if e.__class__ is not tuple else e for e in events]
        # Children end before parents; ties: the inner (later-starting) span first.
        rows.sort(key=_START, reverse=True)  # two stable sorts, C keys: by end, then -start
        rows.sort(key=_END_KEY)
        templates = self._templates
        cached = self._cached
        stamps: list[int] = []
        uuids: list[int] = []
        ids: list[int] = []
        values: list[float] = []  # counter value per packet (0.0 where none)
        put_ts, put_uuid, put_id, put_value = stamps.append, uuids.append, ids.append, values.append
        end_tid = templates.get(_END)
        if end_tid is None:
            end_tid = templates[_END] = self._template(_END, None)
        for kind, start, end, track, name, payload, flow_out, flow_in in rows:
            if kind == SPAN:
                lane, start = self._place(track, start, end)
                uuid = self._track_uuid(track, lane)
                if payload or flow_out or flow_in:
                    tid = cached((name, _args_key(payload), flow_out, flow_in), _BEGIN, name,
                                 payload, flow_out, flow_in)
                else:
                    tid = templates.get(name)
                    if tid is None:
                        tid = cached(name, _BEGIN, name)
                put_ts(start)
                put_uuid(uuid)
                put_id(tid)
                put_value(0.0)
                put_ts(end)
                put_uuid(uuid)
                put_id(end_tid)
                put_value(0.0)
            elif kind == INSTANT:
                tid = cached((_INSTANT, name, _args_key(payload)), _INSTANT, name, payload)
                put_ts(start)
                put_uuid(self._track_uuid(track, 0))
                put_id(tid)
                put_value(0.0)
            elif kind == COUNTER:
                tid = templates.get(_COUNTER)
                if tid is None:
                    tid = cached(_COUNTER, _COUNTER, None)
                put_ts(start)
                put_uuid(self._counter_uuid(name))
                put_id(tid)
                put_value(payload)
        head = self._desc.SerializeToString()
        self._desc = self._interned = None
        if reference:
            return head + self._assemble_reference(stamps, uuids, ids, values)
        return head + self._assemble(stamps, uuids, ids, values)

    def _assemble_reference(self, stamps: list[int], uuids: list[int], ids: list[int],
                            values: list[float]) -> bytes:
        trace = pb.Trace()
        for ts, uuid, tid, value in zip(stamps, uuids, ids, values):
            packet = trace.packet.add()
            packet.MergeFromString(self._template_full[tid])
            packet.timestamp = ts
            packet.track_event.track_uuid = uuid
            if packet.track_event.type == _COUNTER:
                packet.track_event.double_counter_value = value
        return trace.SerializeToString()

    def _assemble(self, stamps: list[int], uuids: list[int], ids: list[int],
                  values: list[float]) -> bytes:
        """Frame + timestamp + template prefix + uuid + template suffix [+ value] per packet."""
        if not stamps:
            return b""
        self._sync_templates()
        ts = np.array(stamps, dtype=np.uint64)
        uuid = np.array(uuids, dtype=np.uint64)
        tid = np.array(ids, dtype=np.int64)
        plen, slen = self._prefix_len[tid], self._suffix_len[tid]
        is_counter = self._template_counter[tid]
        ts_nb = _varint_nbytes(ts)
        body = 1 + ts_nb + plen + _UUID_BYTES + slen + 8 * is_counter
        body_u = body.astype(np.uint64)
        len_nb = _varint_nbytes(body_u)
        size = 1 + len_nb + body
        offsets = np.cumsum(size) - size
        out = np.empty(int(size.sum()), dtype=np.uint8)
        out[offsets] = 0x0A  # Trace.packet: field 1, length-delimited
        _put_varints(out, offsets + 1, body_u, len_nb)
        pos = offsets + 1 + len_nb
        out[pos] = 0x40  # TracePacket.timestamp: field 8, varint
        _put_varints(out, pos + 1, ts, ts_nb)
        pos = pos + 1 + ts_nb
        _ragged_copy(out, pos, self._prefix_buf, self._prefix_off[tid], plen)
        pos = pos + plen
        _put_varints(out, pos, uuid, _UUID_BYTES)
        pos = pos + _UUID_BYTES
        _ragged_copy(out, pos, self._suffix_buf, self._suffix_off[tid], slen)
        counters = np.flatnonzero(is_counter)
        if len(counters):
            value_bytes = np.array(values, dtype="<f8").view(np.uint8).reshape(-1, 8)
            dst = (pos + slen)[counters]
            out[dst[:, None] + np.arange(8)] = value_bytes[counters]
        return out.tobytes()


_START, _END_KEY = itemgetter(1), itemgetter(2)


def _args_key(args: dict | None) -> tuple:
    """A cache key for args (types included: 1, 1.0 and True are different annotations)."""
    if not args:
        return ()
    return tuple(args.items()), tuple(map(type, args.values()))


class PerfettoWriter:
    """A daemon thread that drains a tracer and appends to `path`.

    It wakes every `flush_interval_s`, but writes only when `min_batch` events are waiting or
    `max_interval_s` passed since its last write (few large batches: less CPU, fewer GIL
    handovers); `drain()` (`Tracer.flush`) writes everything at once. Batches are encoded in
    chunks of at most `max_batch` events with a GIL handover between chunks, so the threads
    doing the real work never wait long for the writer.
    """

    def __init__(self, tracer, path: str, *, flush_interval_s: float = 0.2,
                 process_name: str = "agentax", max_batch: int = 8192, min_batch: int = 256,
                 max_interval_s: float | None = None) -> None:
        self.path = path
        self.events_written = 0
        self.bytes_written = 0
        self._tracer = tracer
        self._interval = flush_interval_s
        self._max_interval = max(flush_interval_s, 2.0) if max_interval_s is None \
            else max_interval_s
        self._max_batch = max_batch
        self._min_batch = min_batch
        self._encoder = PacketEncoder(process_name=process_name)
        self._file = open(path, "wb")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentax-trace-writer",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._interval):
            if (len(self._tracer._events) < self._min_batch
                    and time.monotonic() - last < self._max_interval):
                continue
            try:
                self.drain(yield_between=True)
            except Exception as err:  # never kill the run for a trace; say so once
                print(f"agentax.trace: writer failed, tracing to {self.path} stops: {err!r}",
                      file=sys.stderr)
                return
            last = time.monotonic()

    def drain(self, *, yield_between: bool = False) -> None:
        """Encode and append everything buffered now."""
        with self._lock:
            if self._file.closed:
                return
            pending = len(self._tracer._events)
            while pending > 0:
                batch = self._tracer._pop_events(min(pending, self._max_batch))
                if not batch:
                    break
                pending -= len(batch)
                data = self._encoder.encode(batch)
                self._file.write(data)
                self.events_written += len(batch)
                self.bytes_written += len(data)
                if yield_between and pending > 0:
                    time.sleep(0)  # hand the GIL to the threads doing the real work
            self._file.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self.drain()
        with self._lock:
            self._file.close()
