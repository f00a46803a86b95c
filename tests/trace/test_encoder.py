"""The template fast path writes exactly the bytes the generated protobuf classes write."""

import os

from hypothesis import given, settings, strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from agentax.trace import PacketEncoder, Tracer, names, read_trace
from agentax.trace._tracer import COUNTER, INSTANT, SPAN, ThreadTrack

_TRACKS = [None, "trainer", "episode/1", "episode/2", ThreadTrack(11, "main")]
_ARG_VALUES = st.one_of(st.integers(-2**70, 2**70), st.booleans(), st.floats(allow_nan=False),
                        st.text(max_size=300), st.lists(st.integers(), max_size=3))
_EVENT = st.tuples(
    st.sampled_from([SPAN, SPAN, INSTANT, COUNTER]),
    st.integers(0, 2**40), st.integers(0, 10**6),
    st.sampled_from(_TRACKS[1:]), st.sampled_from([names.MODEL_CALL, names.ENV_STEP, "x"]),
    st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "turn", "ok"]), _ARG_VALUES,
                                         max_size=3)),
    st.lists(st.integers(1, 2**64 - 1), max_size=2), st.lists(st.integers(1, 2**64 - 1),
                                                               max_size=2),
    st.floats(allow_nan=False))


def _to_records(draw):
    out = []
    for kind, start, dur, track, name, args, fo, fi, value in draw:
        if kind == SPAN:
            out.append((SPAN, start, start + dur, track, name, args, tuple(fo), tuple(fi)))
        elif kind == INSTANT:
            out.append((INSTANT, start, start, track, name, args, (), ()))
        else:
            out.append((COUNTER, start, start, None, name, value, (), ()))
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(_EVENT, max_size=40), min_size=1, max_size=3))
def test_fast_path_equals_generated_classes(batches):
    fast, ref = PacketEncoder(pid=42), PacketEncoder(pid=42)
    for batch in batches:
        records = _to_records(batch)
        data = fast.encode(list(records))
        assert data == ref.encode(list(records), reference=True)
        pb.Trace.FromString(data)  # and the protos parse it


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
    tracer.close()
    assert args == {"turn": 1}  # set_arg and the writer never touch the caller's dict
    with open(path, "rb") as f:
        trace = pb.Trace.FromString(f.read())
    events = [p for p in trace.packet if p.HasField("track_event")]
    assert len(events) == 50 * (2 * 5 + 2)
    assert all(p.trusted_packet_sequence_id == trace.packet[0].trusted_packet_sequence_id
               for p in trace.packet)
    data = read_trace(path)
    episodes = data.spans_named(names.EPISODE)
    assert [s.args for s in episodes] == [{"id": i, names.ARG_STATUS: "ok"} for i in range(50)]
    assert [s.flow_out for s in episodes] == [(i + 1,) for i in range(50)]
    steps = data.spans_named(names.ENV_STEP)
    assert all(s.dur_ns == 2**40 and s.depth == 1 and s.args == args for s in steps)
    assert [v for _, v in data.counters[names.ENGINE_ACTIVE_SLOTS]] == [0.5, 1.5] * 50
    assert os.path.getsize(path) < 60 * len(events)  # small packets: interned names, no strings


def test_cached_annotations_keep_equal_values_of_other_types_apart():
    # The writer caches encoded (key, value) annotations; 1, True, 1.0 and "1" are equal or
    # alike as dict keys but different annotations, and 0.0 == -0.0 encode differently.
    values = [1, True, 1.0, "1", 0.0, -0.0, 0, False, 2**63, -1, 1, True, -0.0]
    records = [(SPAN, 10 * i, 10 * i + 5, "episode/1", names.ENV_STEP, {"v": v}, (), ())
               for i, v in enumerate(values)]
    fast, ref = PacketEncoder(pid=7), PacketEncoder(pid=7)
    for half in (records[:6], records[6:]):
        assert fast.encode(list(half)) == ref.encode(list(half), reference=True)
