"""Perfetto encoder: turns the tracer's buffered events into `Trace` bytes to append to a file.

The background writer (`agentax.trace._output`) runs it in a child process or a thread.

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
    """Add `args` as debug annotations with the generated classes (the reference encoder)."""
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
            ann.string_value = _as_text(value)


def _as_text(value: Any) -> str:
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _varint(value: int) -> bytes:
    """The base-128 varint of 0 <= value < 2**64."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = [bytes([i]) for i in range(0x80)]
_CACHED_ARG_TYPES = (str, int, bool)  # not float: 0.0 == -0.0, and they encode differently
_MAX_ANNOTATIONS = 1 << 16  # cached annotation entries before the cache is reset


def _annotation_bytes(name_iid: int, value: Any) -> bytes:
    """One `TrackEvent.debug_annotations` entry, as the protos serialize it (field order:
    name_iid, then the value)."""
    if isinstance(value, bool):
        body = b"\x10\x01" if value else b"\x10\x00"
    elif isinstance(value, int) and -(1 << 63) <= value < (1 << 63):
        body = b"\x20" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    elif isinstance(value, float):
        body = b"\x29" + struct.pack("<d", value)
    else:
        text = (value if isinstance(value, str) else _as_text(value)).encode()
        body = b"\x32" + _varint(len(text)) + text
    body = b"\x08" + _varint(name_iid) + body
    return b"\x22" + _varint(len(body)) + body


_PACKET_HEAD = b"\x50" + _varint(SEQUENCE_ID)  # TracePacket.trusted_packet_sequence_id
_NEEDS_FLAGS = b"\x68" + _varint(_NEEDS)  # TracePacket.sequence_flags
# Track uuids all lie in [2**62, 2**63): their varints are 9 bytes, so a template (a packet
# without its track uuid) has one byte layout for every track.
_UUID_BASE = 1 << 62
_UUID_BYTES = 9
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

    Descriptors and interned names are built with the perfetto protos (generated classes). An
    event packet is a *template* -- the `TracePacket` bytes without its timestamp and track
    uuid (and, for a counter, without the value), encoded by hand in the protos' field order --
    cached per (event type, name[, args]); spans with flow ids get a template of their own.
    Per event only the timestamp, track uuid (and counter value) differ, so a batch is assembled
    from `(template, timestamp, uuid, value)` rows with numpy: the `Trace.packet` key and
    length, the `TracePacket.timestamp` key and varint, the template, and the counter's
    little-endian double. `encode(..., reference=True)` builds every packet with the generated
    classes instead (tests check both give equal bytes).
    """

    def __init__(self, *, pid: int | None = None, process_name: str = "agentax",
                 uuid_space: int = 0) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.process_name = process_name
        # `uuid_space` > 0 gives an encoder that continues a file another encoder began (the
        # writer's fallback when its encoder process dies) track uuids of its own.
        self._next_uuid = _UUID_BASE | (uuid_space & 0x3FFF) << 48 | (self.pid & 0xFFFF) << 32 | 1
        self._tracks: dict[Any, int] = {}  # (track, lane) -> uuid
        self._counter_uuids: dict[str, int] = {}  # counter name -> uuid
        self._groups: dict[str, int] = {}
        self._lanes: dict[Any, list[_Lane]] = {}
        self._event_names: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._annotations: dict[tuple, bytes] = {}  # (key, type, value) -> encoded entry
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
        uuid = self._counter_uuids.get(name)
        if uuid is None:
            uuid = self._counter_uuids[name] = self._uuid()
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
        """Index of a new template: the event packet without its timestamp, split around the
        track uuid (and, for a counter, without the value).

        Encoded by hand in the field order the protos serialize (`_proto_packet` builds the
        same packet with the generated classes; the encoder tests check they agree): making a
        template for every episode (its args and flow ids are unique) must cost microseconds.
        """
        body = b"".join([self._annotation(k, v) for k, v in args.items()]) if args else b""
        body += b"\x48" + _varint(kind)  # TrackEvent.type
        if name is not None and kind != _COUNTER:
            body += b"\x50" + _varint(self._name_iid(name))  # TrackEvent.name_iid
        if kind == _COUNTER:
            tail, value_bytes = b"\xe1\x02", 8  # double_counter_value; the 8 bytes come later
        else:
            tail = b"".join([b"\xf9\x02" + struct.pack("<Q", f) for f in flow_out]
                            + [b"\x81\x03" + struct.pack("<Q", f) for f in flow_in])
            value_bytes = 0
        event_len = len(body) + 1 + _UUID_BYTES + len(tail) + value_bytes
        prefix = _PACKET_HEAD + b"\x5a" + _varint(event_len) + body + b"\x58"
        suffix = tail if kind == _COUNTER else tail + _NEEDS_FLAGS
        self._template_specs.append((kind, name, args, flow_out, flow_in))
        self._template_prefix.append(prefix)
        self._template_suffix.append(suffix)
        self._template_kinds.append(kind == _COUNTER)
        return len(self._template_specs) - 1

    def _annotation(self, key: str, value: Any) -> bytes:
        """`_annotation_bytes` of (key, value), cached: most arg values repeat (a status, a
        group, a policy version) even where the args of a span as a whole never do."""
        if value.__class__ not in _CACHED_ARG_TYPES:
            return _annotation_bytes(self._arg_iid(key), value)
        cache_key = (key, value.__class__, value)
        data = self._annotations.get(cache_key)
        if data is None:
            if len(self._annotations) >= _MAX_ANNOTATIONS:
                self._annotations.clear()
            data = self._annotations[cache_key] = _annotation_bytes(self._arg_iid(key), value)
        return data

    def _proto_packet(self, tid: int, ts: int, uuid: int, value: float) -> pb.TracePacket:
        """The packet of template `tid` built with the generated classes (reference path)."""
        kind, name, args, flow_out, flow_in = self._template_specs[tid]
        packet = pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=SEQUENCE_ID)
        ev = packet.track_event
        ev.type = kind
        ev.track_uuid = uuid
        if kind == _COUNTER:
            ev.double_counter_value = value
            return packet
        packet.sequence_flags = _NEEDS
        if name is not None:
            ev.name_iid = self._name_iid(name)
        if args:
            _annotate(ev, args, self._arg_iid)
        ev.flow_ids.extend(flow_out)
        ev.terminating_flow_ids.extend(flow_in)
        return packet

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
        done, count = len(self._template_counter), len(self._template_specs)
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
        self._template_specs = []
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
        if len(self._template_specs) > _MAX_TEMPLATES:
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
        templates, cached, lanes_of = self._templates, self._cached, self._lanes
        track_uuids, counter_uuids = self._tracks, self._counter_uuids
        # Per row: written start, track uuid, template id, counter value (0.0 where none); a
        # span row becomes two packets (begin, end) in `_assemble`.
        starts: list[int] = []
        uuids: list[int] = []
        ids: list[int] = []
        values: list[float] = []
        put_start, put_uuid, put_id, put_value = starts.append, uuids.append, ids.append, \
            values.append
        counter_tid = templates.get(_COUNTER)
        if counter_tid is None:
            counter_tid = cached(_COUNTER, _COUNTER, None)
        for kind, start, end, track, name, payload, flow_out, flow_in in rows:
            if kind == SPAN:
                lanes = lanes_of.get(track)
                root = lanes[0] if lanes is not None else None
                if (root is not None and root.ends and root.ends[-1] <= start
                        and root.origins[-1] < start and len(root.starts) < 2 * _MAX_ROOTS):
                    root.starts.append(start)  # after everything on lane 0 (the common case)
                    root.ends.append(end)
                    root.origins.append(start)
                    uuid = track_uuids.get((track, 0)) or self._track_uuid(track, 0)
                else:
                    lane, start = self._place(track, start, end)
                    uuid = track_uuids.get((track, lane)) or self._track_uuid(track, lane)
                if flow_out or flow_in:  # flow ids are unique: a template for this event only
                    tid = self._template(_BEGIN, name, payload, flow_out, flow_in)
                elif payload:
                    tid = cached((name, _args_key(payload)), _BEGIN, name, payload)
                else:
                    tid = templates.get(name)
                    if tid is None:
                        tid = cached(name, _BEGIN, name)
                put_value(0.0)
            elif kind == COUNTER:
                uuid = counter_uuids.get(name) or self._counter_uuid(name)
                tid = counter_tid
                put_value(payload)
            else:
                tid = cached((_INSTANT, name, _args_key(payload)), _INSTANT, name, payload)
                uuid = self._track_uuid(track, 0)
                put_value(0.0)
            put_start(start)
            put_uuid(uuid)
            put_id(tid)
        end_tid = templates.get(_END)
        if end_tid is None:
            end_tid = templates[_END] = self._template(_END, None)
        stamps, uuids, ids, values = self._packets(rows, starts, uuids, ids, values, end_tid)
        head = self._desc.SerializeToString()
        self._desc = self._interned = None
        if reference:
            return head + self._assemble_reference(stamps, uuids, ids, values)
        return head + self._assemble(stamps, uuids, ids, values)

    @staticmethod
    def _packets(rows: list, starts: list, uuids: list, ids: list, values: list,
                 end_tid: int) -> tuple:
        """Per-packet columns from per-row ones: a span row is a begin and an end packet."""
        if not rows:
            empty = np.zeros(0, dtype=np.uint64)
            return empty, empty, empty.astype(np.int64), empty.astype(np.float64)
        kinds = np.fromiter(map(_KIND, rows), dtype=np.int8, count=len(rows))
        per_row = np.where(kinds == SPAN, 2, 1)
        row = np.repeat(np.arange(len(rows)), per_row)
        is_end = np.zeros(len(row), dtype=bool)
        is_end[np.cumsum(per_row)[kinds == SPAN] - 1] = True
        ends = np.fromiter(map(_END_KEY, rows), dtype=np.uint64, count=len(rows))
        stamps = np.where(is_end, ends[row], np.array(starts, dtype=np.uint64)[row])
        tids = np.where(is_end, end_tid, np.array(ids, dtype=np.int64)[row])
        return (stamps, np.array(uuids, dtype=np.uint64)[row], tids,
                np.array(values, dtype=np.float64)[row])

    def _assemble_reference(self, stamps: np.ndarray, uuids: np.ndarray, ids: np.ndarray,
                            values: np.ndarray) -> bytes:
        trace = pb.Trace()
        for ts, uuid, tid, value in zip(stamps.tolist(), uuids.tolist(), ids.tolist(),
                                        values.tolist()):
            trace.packet.append(self._proto_packet(tid, ts, uuid, value))
        return trace.SerializeToString()

    def _assemble(self, stamps: np.ndarray, uuids: np.ndarray, ids: np.ndarray,
                  values: np.ndarray) -> bytes:
        """Frame + timestamp + template prefix + uuid + template suffix [+ value] per packet."""
        if not len(stamps):
            return b""
        self._sync_templates()
        ts, uuid, tid = stamps, uuids, ids
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
            value_bytes = values.astype("<f8").view(np.uint8).reshape(-1, 8)
            dst = (pos + slen)[counters]
            out[dst[:, None] + np.arange(8)] = value_bytes[counters]
        return out.tobytes()


_KIND, _START, _END_KEY = itemgetter(0), itemgetter(1), itemgetter(2)


def _args_key(args: dict | None) -> tuple:
    """A cache key for args (types included: 1, 1.0 and True are different annotations)."""
    if not args:
        return ()
    return tuple(args.items()), tuple(map(type, args.values()))
