"""Tracer -> Perfetto file -> reader round trips: tracks, nesting across await, flows, counters."""

import asyncio
import os
import threading

import pytest

from agentax.trace import Tracer, names, read_trace, set_enabled, get_tracer, traced
from agentax.trace._tracer import NOOP_SPAN


class FakeClock:
    def __init__(self):
        self.now = 1_000_000

    def __call__(self):
        return self.now


def _trace_path(tmp_path):
    return os.path.join(tmp_path, "trace.perfetto-trace")


def test_episode_tracks_nest_across_await(tmp_path):
    tracer = Tracer()
    tracer.start(tmp_path)

    async def episode(i):
        fid = tracer.new_flow_id()
        with tracer.span(names.EPISODE, track=names.episode_track(i), flow_out=[fid],
                         args={names.ARG_EPISODE_ID: i}):
            for turn in range(2):
                with tracer.span(names.MODEL_CALL):
                    await asyncio.sleep(0.001 * (i + 1))
                with tracer.span(names.ENV_STEP, args={"turn": turn}):
                    await asyncio.sleep(0.001)
        return fid

    async def main():
        flows = await asyncio.gather(*(episode(i) for i in range(3)))
        with tracer.span(names.TRAIN_STEP, track=names.TRAINER_TRACK, flow_in=flows):
            pass
        return flows

    flows = asyncio.run(main())
    tracer.close()
    trace = read_trace(_trace_path(tmp_path))
    for i in range(3):
        on_track = [s for s in trace.spans if s.track == names.episode_track(i)]
        assert [s.name for s in on_track] == [names.EPISODE, names.MODEL_CALL, names.ENV_STEP,
                                              names.MODEL_CALL, names.ENV_STEP]
        span, *children = on_track
        assert span.depth == 0 and span.args == {names.ARG_EPISODE_ID: i}
        assert all(c.depth == 1 and span.start_ns <= c.start_ns <= c.end_ns <= span.end_ns
                   for c in children)
        assert [c.args.get("turn") for c in children if c.name == names.ENV_STEP] == [0, 1]
    (train,) = trace.spans_named(names.TRAIN_STEP)
    assert train.track == names.TRAINER_TRACK and train.flow_in == tuple(flows)
    assert sorted(f for s in trace.spans_named(names.EPISODE) for f in s.flow_out) == sorted(flows)


def test_concurrent_spans_on_one_thread_track_move_to_lanes(tmp_path):
    clock = FakeClock()
    tracer = Tracer(clock=clock)
    tracer.start(tmp_path)
    a, b = tracer.span("a"), tracer.span("b")
    a.__enter__()
    clock.now += 10
    b.__enter__()
    clock.now += 10
    a.__exit__(None, None, None)  # a ends while b (started later) is still open
    clock.now += 10
    b.__exit__(None, None, None)
    with tracer.span("c"):
        clock.now += 5
    tracer.close()
    spans = {s.name: s for s in read_trace(_trace_path(tmp_path)).spans}
    assert (spans["a"].end_ns - spans["a"].start_ns, spans["b"].dur_ns) == (20, 20)
    assert {spans["a"].track, spans["b"].track} == {spans["c"].track, spans["c"].track + " [1]"}
    assert spans["a"].depth == spans["b"].depth == spans["c"].depth == 0


def test_parent_starting_at_same_ns_as_child_still_encloses_it(tmp_path):
    clock = FakeClock()
    tracer = Tracer(clock=clock)
    tracer.start(tmp_path)
    with tracer.span("parent"):
        with tracer.span("child"):
            with tracer.span("grandchild"):
                clock.now += 7
        clock.now += 3
    tracer.close()
    spans = {s.name: s for s in read_trace(_trace_path(tmp_path)).spans}
    assert [spans[n].depth for n in ("parent", "child", "grandchild")] == [0, 1, 2]
    assert spans["grandchild"].dur_ns == 7 and spans["child"].dur_ns >= 7
    assert spans["parent"].end_ns == spans["child"].end_ns + 3
    assert len({s.track for s in spans.values()}) == 1  # no lane needed


def test_thread_tracks_instants_counters_and_error_args(tmp_path):
    tracer = Tracer()
    tracer.start(tmp_path)

    def work():
        with tracer.span("in_thread"):
            pass

    thread = threading.Thread(target=work, name="worker-7")
    thread.start()
    thread.join()
    with pytest.raises(KeyError):
        with tracer.span("fails"):
            raise KeyError("x")
    for depth in (3, 1, 4):
        tracer.counter(names.QUEUE_DEPTH, depth)
    tracer.instant("marker", track="collector", args={"why": "test", "ok": True, "x": 1.5})
    tracer.close()
    trace = read_trace(_trace_path(tmp_path))
    (in_thread,) = trace.spans_named("in_thread")
    (fails,) = trace.spans_named("fails")
    assert in_thread.track.startswith("worker-7 (") and not fails.track.startswith("worker-7")
    assert fails.args == {names.ARG_ERROR: "KeyError"}
    assert [v for _, v in trace.counters[names.QUEUE_DEPTH]] == [3.0, 1.0, 4.0]
    (marker,) = trace.instants_named("marker")
    assert marker.track == "collector" and marker.args == {"why": "test", "ok": True, "x": 1.5}


def test_on_change_counters_skip_repeats_and_same_ns_samples_keep_their_order(tmp_path):
    clock = FakeClock()
    tracer = Tracer(clock=clock)
    tracer.start(tmp_path)
    for value in (0, 0, 1, 1, 0, 2, 2):
        clock.now += 10
        tracer.counter(names.ENGINE_WAITING, value, on_change=True)
    clock.now += 10
    for depth in (2, 2):  # plain samples are all kept (staleness samples are counted)
        tracer.counter(names.QUEUE_DEPTH, depth)
    for value in (1, 0):  # same ns: the later sample is the value that holds afterwards
        tracer.counter(names.ENGINE_ACTIVE_SLOTS, value, on_change=True)
    tracer.close()
    trace = read_trace(_trace_path(tmp_path))
    waiting = trace.counters[names.ENGINE_WAITING]
    assert [v for _, v in waiting] == [0.0, 1.0, 0.0, 2.0]
    assert [t for t, _ in waiting] == [1_000_010, 1_000_030, 1_000_050, 1_000_060]
    assert [v for _, v in trace.counters[names.QUEUE_DEPTH]] == [2.0, 2.0]
    assert [v for _, v in trace.counters[names.ENGINE_ACTIVE_SLOTS]] == [1.0, 0.0]


def test_on_change_counter_starts_each_new_trace_file_with_a_sample(tmp_path):
    tracer = Tracer()
    tracer.start(tmp_path / "first")
    tracer.counter(names.ENGINE_WAITING, 3, on_change=True)
    tracer.close()
    tracer.start(tmp_path / "second")
    tracer.counter(names.ENGINE_WAITING, 3, on_change=True)  # same value, but a new file
    tracer.close()
    second = read_trace(_trace_path(tmp_path / "second"))
    assert [v for _, v in second.counters[names.ENGINE_WAITING]] == [3.0]


def test_traced_decorator_sync_and_async_and_disabled_switch():
    tracer = Tracer()

    @traced(names.ENV_STEP, tracer=tracer)
    def step(x):
        return x + 1

    @traced(tracer=tracer)
    async def reset():
        await asyncio.sleep(0)
        return "obs"

    assert step(1) == 2 and asyncio.run(reset()) == "obs"
    events = tracer.take_events()
    assert [e[4] for e in events] == [names.ENV_STEP, reset.__qualname__]
    tracer.enabled = False
    assert tracer.span("x") is NOOP_SPAN
    step(2)
    tracer.counter("c", 1)
    tracer.instant("i")
    assert tracer.take_events() == []
    set_enabled(False)
    try:
        assert get_tracer().span("y") is NOOP_SPAN
    finally:
        set_enabled(True)
    assert get_tracer().span("y") is not NOOP_SPAN


def test_writes_incrementally_and_each_flush_leaves_a_readable_trace(tmp_path):
    clock = FakeClock()
    tracer = Tracer(clock=clock)
    path = tracer.start(tmp_path, flush_interval_s=60)
    sizes = []
    for chunk in range(3):
        for i in range(200):
            with tracer.span(names.MODEL_CALL, track=names.episode_track(chunk * 200 + i)):
                clock.now += 100
        tracer.flush()
        sizes.append(os.path.getsize(path))
        assert len(read_trace(path).spans) == 200 * (chunk + 1)
    tracer.close()
    growth = [b - a for a, b in zip([0] + sizes, sizes)]
    # Later chunks cost no more than the first: nothing already written is rewritten.
    assert growth[2] <= growth[0] * 1.05 and growth[1] <= growth[0] * 1.05
    assert tracer.stats()["written"] == 601  # and the host_info instant


def test_truncated_file_and_buffer_overflow(tmp_path):
    tracer = Tracer(capacity=10)
    for i in range(25):
        tracer.instant(f"i{i}")
    assert tracer.stats()["dropped"] == 15
    path = tracer.start(tmp_path)
    tracer.close()
    names_kept = [i.name for i in read_trace(path).instants]
    # Newest kept: the host_info instant that start() records pushed out one more.
    assert names_kept == [f"i{i}" for i in range(16, 25)] + [names.HOST_INFO]
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-3])  # a run killed mid-write
    assert [i.name for i in read_trace(path).instants] == names_kept[:-1]
