"""Read a Perfetto trace written by agentax back into plain records (for tests and the doctor).

A file is parsed packet by packet with the same protos the writer used; a truncated last
packet (a run killed mid-write) is ignored, not an error. A run directory is read as all its
segments (`trace.perfetto-trace`, `trace.1.perfetto-trace`, ...: one per resume), laid end to
end: each later segment is shifted to start where the one before ended and its flow ids are
kept apart, so the downtime between a kill and a resume does not count as run time.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from operator import itemgetter
from typing import Any, Iterator, Mapping

from google.protobuf.internal.decoder import _DecodeVarint
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from agentax.trace._files import TRACE_FILENAME
from agentax.trace._writer import segment_path
from agentax.trace.names import HOST_INFO


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpanRecord:
    """One slice of the trace."""

    name: str
    track: str  # custom track name, or "THREADNAME (TID)" for a thread track; "T [k]" for
    #             lane k of track T (spans of T that did not nest, see agentax.trace._writer)
    start_ns: int
    end_ns: int
    depth: int = 0  # nesting depth on its track
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    flow_out: tuple[int, ...] = ()
    flow_in: tuple[int, ...] = ()

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclasses.dataclass(frozen=True, kw_only=True)
class InstantRecord:
    """One instant event."""

    name: str
    track: str
    ts_ns: int
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TraceData:
    """Everything in one trace file."""

    spans: tuple[SpanRecord, ...]
    instants: tuple[InstantRecord, ...]
    counters: Mapping[str, tuple[tuple[int, float], ...]]  # name -> ((ts_ns, value), ...)

    def spans_named(self, name: str) -> list[SpanRecord]:
        return [s for s in self.spans if s.name == name]

    def instants_named(self, name: str) -> list[InstantRecord]:
        return [i for i in self.instants if i.name == name]

    def _stamps(self) -> list[int]:  # without host_info: written at start, maybe long before work
        return [t for s in self.spans for t in (s.start_ns, s.end_ns)] + [
            i.ts_ns for i in self.instants if i.name != HOST_INFO] + [
            t for c in self.counters.values() for t, _ in c]

    @property
    def start_ns(self) -> int:
        return min(self._stamps(), default=0)

    @property
    def end_ns(self) -> int:
        return max(self._stamps(), default=0)


def iter_packets(path: str | os.PathLike) -> Iterator[pb.TracePacket]:
    """Yield the `TracePacket`s of a trace file in file order (a torn last one is skipped)."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0
    while pos < len(buf):
        try:
            tag, body = _DecodeVarint(buf, pos)
            length, body = _DecodeVarint(buf, body)
        except IndexError:
            return
        if tag & 7 != 2 or body + length > len(buf):
            return  # not length-delimited: not ours; or a truncated tail
        if tag == 0x0A:  # Trace.packet; other fields are skipped
            yield pb.TracePacket.FromString(buf[body:body + length])
        pos = body + length


def _read_file(path: str, after_ns: int | None = None, flow_base: int = 0) -> TraceData:
    """One file; with `after_ns`, shifted to start just after it and flow ids moved up by
    `flow_base` (a later segment of a run)."""
    track_name: dict[int, str] = {}
    counters: dict[str, list] = defaultdict(list)
    timeline: list[tuple] = []
    for packet in iter_packets(path):
        if packet.HasField("track_descriptor"):
            desc = packet.track_descriptor
            track_name[desc.uuid] = f"{desc.thread.thread_name} ({desc.thread.tid})" \
                if desc.HasField("thread") else desc.name
        elif packet.track_event.type == pb.TrackEvent.TYPE_COUNTER:
            counters[track_name.get(packet.track_event.track_uuid, "?")].append(
                (packet.timestamp, packet.track_event.double_counter_value))
        elif packet.HasField("track_event"):
            ev = packet.track_event
            args = {a.name: getattr(a, a.WhichOneof("value")) for a in ev.debug_annotations}
            timeline.append((packet.timestamp, len(timeline), ev.track_uuid, ev.type, ev.name,
                             args, tuple(flow_base + f for f in ev.flow_ids),
                             tuple(flow_base + f for f in ev.terminating_flow_ids)))
    stamps = [e[0] for e in timeline] + [t for c in counters.values() for t, _ in c]
    shift = 0 if after_ns is None or not stamps else after_ns + 1 - min(stamps)
    # Match begins and ends the way trace processor does: by timestamp, ties in file order.
    timeline.sort(key=lambda e: (e[0], e[1]))
    stacks: dict[int, list] = defaultdict(list)
    spans, instants = [], []
    for ts, _, uuid, kind, name, args, flow_out, flow_in in timeline:
        track = track_name.get(uuid, str(uuid))
        if kind == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks[uuid].append((name, ts, args, flow_out, flow_in))
        elif kind == pb.TrackEvent.TYPE_SLICE_END and stacks[uuid]:
            name, start, args, flow_out, flow_in = stacks[uuid].pop()
            spans.append(SpanRecord(name=name, track=track, start_ns=start + shift,
                                    end_ns=ts + shift, depth=len(stacks[uuid]), args=args,
                                    flow_out=flow_out, flow_in=flow_in))
        elif kind == pb.TrackEvent.TYPE_INSTANT:
            instants.append(InstantRecord(name=name, track=track, ts_ns=ts + shift, args=args))
    spans.sort(key=lambda s: (s.start_ns, -s.end_ns))
    instants.sort(key=lambda i: i.ts_ns)
    # Counters sort by time only (stable): same-ns samples keep their order; the last one holds.
    return TraceData(spans=tuple(spans), instants=tuple(instants),
                     counters={k: tuple((t + shift, v) for t, v in sorted(c, key=itemgetter(0)))
                               for k, c in counters.items()})


def trace_segments(run_dir: str | os.PathLike) -> list[str]:
    """The trace files of a run directory, oldest first (empty if it has none)."""
    base, found = os.path.join(os.fspath(run_dir), TRACE_FILENAME), []
    while os.path.exists(segment_path(base, len(found))):
        found.append(segment_path(base, len(found)))
    return found


def read_trace(path: str | os.PathLike) -> TraceData:
    """Parse a trace file written by `Tracer.start`, or all segments of a run directory.

    Raises:
      FileNotFoundError: a missing file, or a directory without a trace.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        return _read_file(path)
    files = trace_segments(path)
    if not files:
        raise FileNotFoundError(
            f"no trace in {path!r}: expected {TRACE_FILENAME}; was the run started with "
            f"tracing on (tracer.start(run_dir))?")
    parts = [_read_file(files[0])]
    for file in files[1:]:
        flows = [f for p in parts for s in p.spans for f in s.flow_out + s.flow_in]
        parts.append(_read_file(file, after_ns=max(p.end_ns for p in parts),
                                flow_base=max(flows, default=0)))
    return TraceData(
        spans=tuple(s for p in parts for s in p.spans),
        instants=tuple(i for p in parts for i in p.instants),
        counters={k: tuple(x for p in parts for x in p.counters.get(k, ()))
                  for k in dict.fromkeys(k for p in parts for k in p.counters)})
