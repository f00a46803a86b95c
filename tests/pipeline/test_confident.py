"""Tasks whose groups keep coming back all-equal rest, and the warning about them comes at most
once a minute, naming the tasks; the books still balance (a rested admission starts nothing).
A policy that has converged ends RL early (`stop_success`)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from agentax.pipeline import Pipeline, PipelineConfig
from agentax.pipeline._confident import DropReport, SuccessStop, TaskRest
from agentax.records import Group, Task, Trajectory, TrajectoryStatus

TASKS = [Task(id=f"t{i}", prompt=f"task {i}") for i in range(5)]


def _group(index: int, task: Task, rewards) -> Group:
    trajs = tuple(Trajectory(
        task_id=task.id, token_ids=np.arange(4, dtype=np.int32),
        loss_mask=np.array([0, 0, 1, 1], np.int8), logprobs=np.zeros(4, np.float32),
        versions=np.zeros(4, np.int32), reward=float(r), status=TrajectoryStatus.OK,
        group_id=f"g{index}", sample_index=i) for i, r in enumerate(rewards))
    return Group(group_id=f"g{index}", task_id=task.id, trajectories=trajs)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_task_rest_doubles_up_to_its_cap_and_a_signal_ends_it():
    rest = TaskRest(rest_after=3, max_rest=4)
    for _ in range(2):
        rest.observe("a", True)
    assert not rest.skip("a")  # two all-equal groups: not yet
    rest.observe("a", True)
    assert [rest.skip("a") for _ in range(2)] == [True, False]  # 1 skipped
    rest.observe("a", True)
    assert [rest.skip("a") for _ in range(3)] == [True, True, False]  # 2
    for _ in range(5):
        rest.observe("a", True)
    assert sum(rest.skip("a") for _ in range(10)) == 4  # capped
    rest.observe("a", True)
    rest.observe("a", False)  # rewards differ: the rest ends
    assert not rest.skip("a") and rest.resting() == []
    never = TaskRest(rest_after=0, max_rest=4)
    for _ in range(10):
        never.observe("a", True)
    assert not never.skip("a")


def _simulate(rest_after: int, caplog) -> tuple[Pipeline, list[str], list[tuple[int, str]]]:
    """Five simulated minutes, a group a second: t0-t3's groups always all-equal, t4's never
    (80 % all-equal while nothing rests). Returns the pipeline, the tasks admitted in order and
    the warnings with the simulated second each was given at."""
    config = PipelineConfig(group_size=4, groups_per_step=1, rest_confident_after=rest_after)
    pipeline = Pipeline(None, None, None, TASKS, config)
    clock = Clock()
    pipeline._drops = DropReport(min_groups=8, clock=clock)  # the same report, on a virtual clock
    admitted, warnings = [], []
    try:
        with caplog.at_level(logging.WARNING, logger="agentax.pipeline._pipeline"):
            for second in range(300):
                clock.now = float(second)
                index = pipeline._admit()
                task = pipeline._admitted.pop(index)
                admitted.append(task.id)
                rewards = [1.0] * 4 if task.id != "t4" else [0.0, 1.0, 1.0, 0.0]
                pipeline.accounting.started += 4
                seen = len(caplog.records)
                if pipeline._screen(_group(index, task, rewards)) is not None:
                    pipeline.accounting.trained += 4
                warnings += [(second, r.getMessage()) for r in caplog.records[seen:]]
    finally:
        pipeline._executor.shutdown()
    acc = pipeline.accounting
    acc.check()  # nothing in flight, nothing lost: trained + filtered == started
    confident = sum(admitted.count(t) for t in ("t0", "t1", "t2", "t3"))
    assert acc.filtered["all_equal_rewards"] == 4 * confident
    return pipeline, admitted, warnings


def test_all_equal_groups_warn_at_most_once_a_minute_naming_the_tasks(caplog):
    _, admitted, warnings = _simulate(0, caplog)  # nothing rests: 80 % all-equal throughout
    assert admitted.count("t4") == 60
    seconds = [s for s, _ in warnings]
    assert len(seconds) == 5 and all(b - a >= 60 for a, b in zip(seconds, seconds[1:])), seconds
    for _, text in warnings:
        assert "same reward" in text and ("(80%," in text or "(89%," in text), text
        assert all(f"t{i} (" in text for i in range(4)) and "t4 (" not in text
        assert "reward 1)" in text and "pipeline.rest_confident_after=0" in text
        assert "pipeline.filters=[]" in text and "sft.steps" in text


def test_a_confident_task_rests_and_the_others_get_the_rollouts(caplog):
    pipeline, admitted, warnings = _simulate(3, caplog)
    counts = {t.id: admitted.count(t.id) for t in TASKS}
    # t4 (the one with a learning signal) gets most groups; the confident ones rest.
    assert counts["t4"] > 3 * max(counts[t] for t in ("t0", "t1", "t2", "t3")), counts
    acc = pipeline.accounting
    assert set(acc.rested) == {"t0", "t1", "t2", "t3"} and acc.summary()["rested"] == dict(acc.rested)
    # Fewer all-equal groups (under half of them once the four rest), so fewer warnings.
    assert 1 <= len(warnings) < 5, warnings


def test_the_warning_says_what_rests():
    import collections

    clock = Clock()
    report = DropReport(min_groups=2, clock=clock)
    for reward in (0.0, 0.0, 0.5):
        report.observe("t0", True, 4, reward)
    clock.now = 30.0
    assert report.due()
    text = report.message(resting=["t0"], rested=collections.Counter(t0=7), knobs="KNOBS")
    assert text.startswith("in the last 30 s, 3 of 3 groups (100%, 12 episodes)")
    assert "t0 (3, reward 0/0.5)" in text and "resting 1 task(s) (t0), 7 admissions skipped" in text
    assert text.endswith("; KNOBS") and not report.due()  # a new window, and rate-limited


def test_success_stop_needs_a_full_window_at_the_rate():
    stop = SuccessStop(rate=0.75, window=8)
    stop.observe([1.0, 1.0, 1.0, 1.0])
    assert not stop.reached()  # half a window
    stop.observe([1.0, 0.0, 1.0, 0.0])
    assert stop.success == 0.75 and stop.reached()
    stop.observe([0.0, 0.0])  # the window slides: 4 of the latest 8
    assert stop.success == 4 / 8 and not stop.reached()
    never = SuccessStop(rate=0.0, window=1)
    never.observe([1.0])
    assert not never.reached()


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_converged_policy_ends_rl_early_and_the_books_balance(make_parts, tasks, mode):
    """Rewards differ while the policy is at version 0 (a step can train), then every episode
    succeeds: with stop_success the run ends once 16 episodes in a row succeeded, long before its
    20 steps (without it, all-equal groups would be dropped until max_dropped_episodes)."""
    import random as _random

    from agentax.envs import TaskEnvironment

    rng = _random.Random(0)
    box = {}

    def reward(task, response):
        return 1.0 if box["pipeline"].version >= 1 else float(rng.random() < 0.5)

    parts = make_parts(env_factory=lambda: TaskEnvironment(reward))
    config = PipelineConfig(group_size=2, groups_per_step=1, max_concurrency=4, mode=mode,
                            stop_success=0.9, stop_window=16)
    pipeline = box["pipeline"] = Pipeline(parts.collector, parts.trainer, parts.engine, tasks,
                                          config)
    result = pipeline.run(20)
    assert 1 <= len(result.steps) < 20
    assert "the last 16 training episodes succeeded at" in pipeline.stopped_early
    assert "pipeline.stop_success=0.9" in pipeline.stopped_early
    result.accounting.check()
    assert result.accounting.filtered["all_equal_rewards"] > 0


def test_stop_success_is_checked_and_refused_with_several_processes():
    with pytest.raises(ValueError, match="stop_success must be in"):
        PipelineConfig(stop_success=1.5)
    with pytest.raises(ValueError, match="stop_window"):
        PipelineConfig(stop_window=0)
    with pytest.raises(ValueError, match="one process"):
        Pipeline(None, None, None, TASKS, PipelineConfig(stop_success=0.9), data_shard=(0, 2))
