"""The Perfetto writer: what is recorded reads back, flushes are incremental, exit writes the
tail, and a second writer never truncates a file but starts the next segment."""

import enum
import os
import re
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from agentax.trace import Tracer, doctor, names, read_trace, trace_segments
from agentax.trace._tracer import COUNTER, INSTANT, SPAN, ThreadTrack
from agentax.trace._writer import PacketEncoder

_TRACKS = ["trainer", "episode/1", "episode/2", ThreadTrack(11, "main")]
_ARG_VALUES = st.one_of(st.integers(-2**63, 2**63 - 1), st.booleans(),
                        st.floats(allow_nan=False), st.text(max_size=300))
# Starts far from 0, as a monotonic ns clock gives them: a parent that starts on the same ns as
# its children is written a few ns earlier, which a timestamp near 0 has no room for.
_EVENT = st.tuples(
    st.sampled_from([SPAN, SPAN, INSTANT, COUNTER]), st.integers(2**20, 2**40),
    st.integers(0, 10**6), st.sampled_from(_TRACKS),
    st.sampled_from([names.MODEL_CALL, names.ENV_STEP, "x"]),
    st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "turn", "ok"]), _ARG_VALUES,
                                         min_size=1, max_size=3)),
    st.lists(st.integers(1, 2**63), max_size=2, unique=True), st.floats(allow_nan=False))


def _label(track):
    return f"{track.name} ({track.tid})" if isinstance(track, ThreadTrack) else track


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(_EVENT, max_size=40), min_size=1, max_size=3))
def test_any_batches_read_back_as_recorded(tmp_path_factory, batches):
    path = tmp_path_factory.mktemp("w") / "t.perfetto-trace"
    encoder, spans, instants, counters, flow = PacketEncoder(pid=42), [], [], [], 0
    with open(path, "wb") as f:
        for batch in batches:
            records = []
            for kind, start, dur, track, name, args, flows, value in batch:
                flow += 1
                if kind == SPAN:  # unique flow ids, as the tracer hands them out
                    fo, fi = tuple(x + flow * 2**8 for x in flows), (flow,)
                    records.append((SPAN, start, start + dur, track, name, args, fo, fi))
                    spans.append((name, _label(track), start + dur, args or {}, fo, fi, start))
                elif kind == INSTANT:
                    records.append((INSTANT, start, start, track, name, args, (), ()))
                    instants.append((name, _label(track), start, args or {}))
                else:
                    records.append((COUNTER, start, start, None, name, value, (), ()))
                    counters.append((name, start, value))
            data = encoder.encode(records)
            pb.Trace.FromString(data)  # each batch alone is a valid Trace message
            f.write(data)
    got = read_trace(path)
    # Spans that did not nest on their track were written to its lanes, "T [1]", ...
    read = sorted(((s.name, re.sub(r" \[\d+\]$", "", s.track), s.end_ns, dict(s.args),
                    s.flow_out, s.flow_in) for s in got.spans), key=repr)
    assert read == sorted((x[:6] for x in spans), key=repr)
    # A parent that starts on the same ns as a child is written up to a few ns earlier.
    starts = {x[4] + x[5]: x[6] for x in spans}
    assert all(0 <= starts[s.flow_out + s.flow_in] - s.start_ns <= 8 for s in got.spans)
    assert sorted(((i.name, i.track, i.ts_ns, dict(i.args)) for i in got.instants),
                  key=repr) == sorted(instants, key=repr)
    assert sorted((k, t, v) for k, c in got.counters.items() for t, v in c) == \
        sorted(counters)


class Color(enum.IntEnum):
    RED = 1


def test_written_file_parses_with_protos_and_reads_back(tmp_path):
    clock = [10**12]
    tracer = Tracer(clock=lambda: clock[0])
    path = tracer.start(tmp_path, flush_interval_s=60)
    args = {"turn": 1}
    for eid in range(50):
        with tracer.span(names.EPISODE, track=names.episode_track(eid), args={"id": eid},
                         flow_out=(eid + 1,)) as span:
            for turn in range(2):
                with tracer.span(names.MODEL_CALL):
                    clock[0] += 1000
                tracer.counter(names.ENGINE_ACTIVE_SLOTS, turn + 0.5)
                with tracer.span(names.ENV_STEP, args=args):
                    clock[0] += 2**40  # timestamps with long varints
            span.set_arg(names.ARG_STATUS, "ok")
        if eid % 10 == 9:
            tracer.flush()
            assert tracer.stats()["buffered"] == 0
            assert os.path.getsize(path) == tracer.stats()["bytes"]  # it is in the file
    tracer.instant("odd", track="collector", args={
        "np_float": np.float64(0.25), "np_int": np.int64(7), "enum": Color.RED,
        "obj": types.SimpleNamespace(a=1), "big": 2**70, "list": [1, 2]})
    tracer.close()
    assert args == {"turn": 1}  # set_arg and the writer never touch the caller's dict
    with open(path, "rb") as f:
        trace = pb.Trace.FromString(f.read())
    events = [p for p in trace.packet if p.HasField("track_event")]
    assert len(events) == 50 * (2 * 5 + 2) + 2  # and the odd instant, the host_info one
    assert {p.trusted_packet_sequence_id for p in trace.packet} == {
        trace.packet[0].trusted_packet_sequence_id}
    data = read_trace(path)
    episodes = data.spans_named(names.EPISODE)
    assert [s.args for s in episodes] == [{"id": i, names.ARG_STATUS: "ok"} for i in range(50)]
    assert [s.flow_out for s in episodes] == [(i + 1,) for i in range(50)]
    steps = data.spans_named(names.ENV_STEP)
    assert all(s.dur_ns == 2**40 and s.depth == 1 and s.args == args for s in steps)
    assert [v for _, v in data.counters[names.ENGINE_ACTIVE_SLOTS]] == [0.5, 1.5] * 50
    assert data.instants[-1].args == {"np_float": 0.25, "np_int": '"7"', "enum": 1,
                                      "obj": '"namespace(a=1)"', "big": str(2**70),
                                      "list": "[1, 2]"}
    assert os.path.getsize(path) < 60 * len(events)  # small packets: interned names


def test_exiting_interpreter_writes_the_tail(tmp_path):
    script = textwrap.dedent(f"""
        from agentax.trace import Tracer
        tracer = Tracer()
        tracer.start({str(tmp_path)!r}, flush_interval_s=60)
        for i in range(3000):
            with tracer.span("tail", args={{"i": i}}):
                pass
        # no close(): the atexit hook must write the buffered events
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    data = read_trace(tmp_path / "trace.perfetto-trace")
    assert sorted(s.args["i"] for s in data.spans_named("tail")) == list(range(3000))


def _segment(run_dir, clock, episodes, first_flow):
    tracer = Tracer(clock=lambda: clock[0])
    path = tracer.start(run_dir)
    for i in range(episodes):
        fid = first_flow + i  # a new process hands out flow ids from 1 again
        with tracer.span(names.EPISODE, track=names.episode_track(i), flow_out=(fid,)):
            clock[0] += 10**9
        with tracer.span(names.TRAIN_STEP, track=names.TRAINER_TRACK, flow_in=(fid,)):
            clock[0] += 10**9
    tracer.close()
    return path


def test_resume_writes_a_new_segment_and_the_doctor_reads_all(tmp_path):
    clock = [10**12]
    first = _segment(tmp_path, clock, 3, 1)
    with open(first, "rb") as f:
        before = f.read()
    clock[0] += 3600 * 10**9  # the run was down for an hour before the resume
    second = _segment(tmp_path, clock, 2, 1)
    assert [os.path.basename(p) for p in (first, second)] == [
        "trace.perfetto-trace", "trace.1.perfetto-trace"]
    with open(first, "rb") as f:
        assert f.read() == before  # never truncated, never appended to
    assert trace_segments(tmp_path) == [first, second]
    data = read_trace(tmp_path)
    assert len(data.spans_named(names.EPISODE)) == 5
    assert data.end_ns - data.start_ns == pytest.approx(10 * 10**9, abs=10)  # downtime dropped
    flows = [s.flow_in for s in data.spans_named(names.TRAIN_STEP)]
    assert len(set(flows)) == 5  # flow ids of the two segments kept apart
    report = doctor.analyze(tmp_path)
    assert report.episodes == 5 and report.train_steps == 5
    assert report.wall_s == pytest.approx(10.0, abs=1e-6)
    assert read_trace(second).spans_named(names.EPISODE)[0].flow_out == (1,)


def test_idle_tracks_are_forgotten_and_described_anew(tmp_path, monkeypatch):
    import agentax.trace._writer as writer

    monkeypatch.setattr(writer, "_MAX_TRACKS", 2)
    encoder, path = PacketEncoder(pid=1), tmp_path / "t.perfetto-trace"
    order = ["episode/1", "episode/2", "episode/3", "episode/1"]  # 1 is forgotten, then reused
    with open(path, "wb") as f:
        for i, track in enumerate(order):
            t = 1000 * (i + 1)
            f.write(encoder.encode([(SPAN, t + 10, t + 20, track, "child", None, (), ()),
                                    (SPAN, t, t + 500, track, "parent", None, (), ())]))
    assert len(encoder._lanes) == 2 and ("episode/1", 0) in encoder._tracks
    spans = read_trace(path).spans
    assert [(s.track, s.name, s.depth) for s in spans] == [
        (track, name, depth) for track in order for name, depth in (("parent", 0), ("child", 1))]


def test_a_full_drain_batch_wakes_the_writer_before_its_interval(tmp_path):
    """`DRAIN_AT` buffered events are written in the background without waiting for the flush
    interval (an hour here) or `close`, so little is left for `close` to encode."""
    from agentax.trace._writer import DRAIN_AT

    tracer = Tracer()
    tracer.start(tmp_path, flush_interval_s=3600)
    for i in range(DRAIN_AT + 10):
        with tracer.span(names.ENV_STEP, args={"turn": i}):
            pass
    deadline = time.monotonic() + 30  # a bound on the wait, not a timing assertion
    while tracer.stats()["written"] < DRAIN_AT and time.monotonic() < deadline:
        time.sleep(0.01)
    written = tracer.stats()["written"]
    tracer.close()
    assert written >= DRAIN_AT  # host info + the spans, before close
    assert len(read_trace(tmp_path).spans_named(names.ENV_STEP)) == DRAIN_AT + 10
