"""benchmarks/pipeline.py: the tail ceiling (the pipeline's schedule — gate and straggler rule —
replayed in virtual time on a sync run's group times) and the paired episode latencies that
both arms of a comparison share."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "pipeline.py"
_spec = importlib.util.spec_from_file_location("pipeline_benchmark", _SCRIPT)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

GPS = 4


def _sync_run(group_s: list[float], cost_s: float) -> dict:
    """A sync run's record: each step waits for its slowest group, then trains for cost_s."""
    walls, t = [], 0.0
    for k in range(len(group_s) // GPS):
        t += max(group_s[k * GPS:(k + 1) * GPS]) + cost_s
        walls.append(t)
    steps = len(walls)
    rollout = sum(w - (walls[k - 1] if k else 0.0) - cost_s for k, w in enumerate(walls))
    return {"step_wall_s": walls, "group_s": group_s, "groups_per_step": GPS,
            "max_running_groups": 10**6, "rollout_s": rollout / steps, "train_s": cost_s}


@pytest.mark.parametrize("max_staleness", [1, 2, 3])
@pytest.mark.parametrize("group_s, cost_s", [(1.0, 0.1), (0.2, 0.3)])
def test_tail_ceiling_equals_the_constant_ceiling_when_rollouts_do_not_vary(max_staleness, group_s, cost_s):
    sync = _sync_run([group_s] * (80 * GPS), cost_s)
    assert bench.tail_ceiling(sync, max_staleness) == pytest.approx(
        bench.ceiling(sync, max_staleness), rel=0.03)  # steps alternate: a partial period


def test_a_straggler_costs_async_more_than_the_constant_ceiling_assumes():
    group_s = [1.0] * (40 * GPS)
    for k in range(5, 40, 6):
        group_s[k * GPS] = 4.0  # one slow group every sixth step
    sync = _sync_run(group_s, 0.1)
    tail, flat = bench.tail_ceiling(sync, 2), bench.ceiling(sync, 2)
    assert 1.0 < tail < flat - 0.3
    assert bench.tail_ceiling(sync, 1) < bench.tail_ceiling(sync, 2)


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_replay_drops_only_a_straggler_past_the_limit_and_keeps_the_bound(max_staleness):
    group_s = [1.0] * (40 * GPS)
    group_s[60] = 3.0  # slow, but under 3.5 x the median: waited for
    group_s[100] = 20.0  # a straggler: dropped once it has run 3.5 s, a fresh group takes its place
    out = bench.replay_schedule(group_s, [0.1], max_staleness, GPS, max_running=10**6)
    never = bench.replay_schedule(group_s, [0.1], max_staleness, GPS, max_running=10**6,
                                  straggler_factor=None)
    assert (out["dropped"], out["missed"], never["dropped"], never["missed"]) == (1, 0, 0, 0)
    assert max(out["staleness"]) == max(never["staleness"]) == max_staleness
    assert len(out["staleness"]) == len(out["step_ends"]) * GPS
    assert 0 <= out["started"] - 1 - len(out["staleness"]) < GPS  # at the end: too few for a step
    steps = len(never["step_ends"]) - 1  # the drop run has one group fewer to train
    # Waiting 20 s for the straggler costs the never-drop schedule ~16 s more than dropping it.
    assert never["step_ends"][steps - 1] - out["step_ends"][steps - 1] > 14.0
    sync = _sync_run(group_s, 0.1)
    assert bench.tail_ceiling(sync, max_staleness) > bench.tail_ceiling(sync, max_staleness, None)


def test_episode_latencies_are_paired_by_start_order_and_lognormal():
    a, b = bench.EpisodeLatencies(0.1, seed=1), bench.EpisodeLatencies(0.1, seed=1)
    first = [a.next_episode() for _ in range(500)]
    assert first == [b.next_episode() for _ in range(500)]
    assert first != [bench.EpisodeLatencies(0.1, seed=2).next_episode() for _ in range(500)]
    flat = [x for episode in first for x in episode]
    assert all(len(episode) == bench.LatencyEnv.max_steps for episode in first)
    assert statistics.median(flat) == pytest.approx(0.1, rel=0.15)
    assert sorted(flat)[int(0.99 * len(flat))] == pytest.approx(1.0, rel=0.4)  # p99 = 10 x median


def test_later_group_times_continue_the_paired_latency_stream():
    import argparse

    args = argparse.Namespace(group_size=GPS)
    latencies = bench.EpisodeLatencies(0.1, seed=1)
    first = [max(sum(0.02 + x for x in latencies.next_episode()) for _ in range(GPS))
             for _ in range(10)]  # what a 10-group sync run's episodes got
    after = [max(sum(0.02 + x for x in latencies.next_episode()) for _ in range(GPS))
             for _ in range(10)]
    assert bench.later_group_s(0.1, 10, 0.02, args) == pytest.approx(after)
    assert after != pytest.approx(first)
