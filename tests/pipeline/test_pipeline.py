"""The pipeline end to end with a real tiny engine, trainer and environments."""

from __future__ import annotations

import random
import time

import jax
import numpy as np
import pytest

from agentax.pipeline import Pipeline, PipelineConfig, group_staleness
from agentax.records import TrajectoryStatus


def _record_groups(trainer):
    seen = []
    inner = trainer.step

    def step(groups):
        seen.append(list(groups))
        return inner(groups)

    trainer.step = step
    return seen


def _run(parts, steps, tasks, **cfg):
    seen = _record_groups(parts.trainer)
    config = PipelineConfig(group_size=3, groups_per_step=2, max_concurrency=8, filters=(), **cfg)
    result = Pipeline(parts.collector, parts.trainer, parts.engine, tasks, config).run(steps)
    return result, seen


def test_async_staleness_zero_reproduces_sync(make_parts, tasks):
    sync_parts, async_parts = make_parts(), make_parts()
    sync_res, sync_groups = _run(sync_parts, 3, tasks, mode="sync", max_staleness=0)
    async_res, async_groups = _run(async_parts, 3, tasks, mode="async", max_staleness=0)
    assert len(sync_groups) == len(async_groups) == 3
    for gs, ga in zip(sync_groups, async_groups):
        assert [g.group_id for g in gs] == [g.group_id for g in ga]
        for a, b in zip(gs, ga):
            for ta, tb in zip(a.trajectories, b.trajectories):
                np.testing.assert_array_equal(ta.token_ids, tb.token_ids)
                assert ta.reward == tb.reward
                np.testing.assert_array_equal(ta.versions, tb.versions)
    # Sampling really is stochastic (different samples inside a group), so equality means something.
    first = sync_groups[0][0].trajectories
    assert len({t.token_ids.tobytes() for t in first}) > 1
    for pa, pb in zip(jax.tree.leaves(sync_parts.trainer.params_for_engine()),
                      jax.tree.leaves(async_parts.trainer.params_for_engine())):
        # Same groups, same steps: Adam at lr 3e-3 moves weights by ~3e-3 a step, so a missing,
        # extra or different step shows far above 1e-4; CPU float reductions may differ by ~2e-5.
        np.testing.assert_allclose(np.asarray(pa), np.asarray(pb), atol=1e-4, rtol=1e-4)
    # Synchronous: every token was produced by the weights the trainer held when it stepped.
    assert all(s == 0 for rec in async_res.steps for s in rec.staleness)
    assert sync_res.accounting.trained == async_res.accounting.trained == 18


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_async_bounds_staleness_and_versions_tokens(make_parts, tasks, max_staleness):
    parts = make_parts()
    result, seen = _run(parts, 4, tasks, mode="async", max_staleness=max_staleness)
    assert len(result.steps) == 4
    for rec in result.steps:
        assert max(rec.staleness) <= max_staleness
    # Tokens carry the version of the weights that produced them; later steps see newer ones.
    versions = [int(t.versions[t.loss_mask > 0].max()) for g in seen[-1] for t in g.trajectories]
    assert max(versions) >= 1
    deadline = time.time() + 30  # publication lands between two engine steps: wait for it
    while parts.engine.policy_version != 4 and time.time() < deadline:
        time.sleep(0.01)
    assert parts.engine.policy_version == 4
    result.accounting.check()


def test_fault_injection_keeps_accounting(make_parts, tasks, flaky_env):
    # 13% of calls raise or hang: at 15% + 10% most episodes failed and, groups of 3 being
    # dropped whole, the run started ~30 episodes per one trained (19-42 s); ~4.5 now.
    rng = random.Random(0)
    parts = make_parts(env_factory=lambda: flaky_env(rng, p_raise=0.05, p_hang=0.08))
    result, _ = _run(parts, 3, tasks, mode="async", max_staleness=1)
    acc = result.accounting
    acc.check()
    assert acc.trained == 3 * 2 * 3
    assert acc.failed["env_error"] > 0 and acc.failed["timeout"] > 0  # raised, hung
    assert set(acc.failed) <= {s.value for s in TrajectoryStatus}
    assert acc.started == acc.trained + acc.num_filtered + acc.num_failed


def test_all_equal_filter_drops_counts_and_warns(make_parts, tasks, caplog):
    import asyncio

    from agentax.envs import TaskEnvironment

    parts = make_parts(env_factory=lambda: TaskEnvironment(lambda task, resp: 1.0))
    config = PipelineConfig(group_size=2, groups_per_step=1, max_concurrency=4, mode="async",
                            max_staleness=1)
    pipeline = Pipeline(parts.collector, parts.trainer, parts.engine, tasks, config)
    warn_at = 8 * 2  # 8 x groups_per_step groups in a row, 2 episodes each
    wait_for = 2 * 4 * len(tasks)  # every task came back all-equal 4 times: each has rested

    async def run_until_warned():
        run = asyncio.create_task(pipeline.arun(1))
        # Every group has equal rewards, so the run can never step: wait for the drops
        # (a condition, not a fixed time), then cancel it as Ctrl-C would.
        while pipeline.accounting.filtered["all_equal_rewards"] < wait_for and not run.done():
            await asyncio.sleep(0.05)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    with caplog.at_level("WARNING", logger="agentax.pipeline._pipeline"):
        asyncio.run(run_until_warned())
    acc = pipeline.accounting
    assert acc.filtered["all_equal_rewards"] >= warn_at and acc.trained == 0
    # One warning, specific: the share, the tasks with the reward their samples shared, the
    # tasks resting, the knobs.
    warnings = [r.getMessage() for r in caplog.records if "same reward" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "groups (100%," in warnings[0] and "t0 (" in warnings[0] and "reward 1)" in warnings[0]
    assert "pipeline.rest_confident_after=3" in warnings[0]
    assert "pipeline.filters=[]" in warnings[0]
    assert "pipeline.stop_success=0.95 stops once the latest 256 training episodes" in warnings[0]
    # Each task came back all-equal 3 times in a row and rests: admissions skipped, counted.
    assert acc.rested and set(acc.rested) <= {t.id for t in tasks}
    assert acc.summary()["rested"] == dict(acc.rested)
    # Cancelled mid-run: nothing hangs and every episode is still accounted for.
    acc.check()
    assert acc.started == acc.num_filtered + acc.num_failed
    assert set(acc.failed) <= {TrajectoryStatus.CANCELLED.value}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf x 0 in the schedule
def test_a_step_the_trainer_skips_trains_no_episode(make_parts, tasks):
    """A real RLTrainer told to skip non-finite updates (an infinite learning rate makes every
    update non-finite) applies nothing: its episodes are counted as filtered, not trained."""
    parts = make_parts(learning_rate=float("inf"), on_nonfinite="skip")
    result, seen = _run(parts, 2, tasks, mode="sync")
    assert all(rec.metrics.skipped for rec in result.steps) and parts.trainer.step_count == 0
    fed = sum(len(g.trajectories) for groups in seen for g in groups)
    assert fed == 12 and result.accounting.trained == 0
    assert result.accounting.filtered["train_step_skipped"] == fed
    result.accounting.check()


def test_group_staleness():
    from agentax.records import Group, Trajectory

    def traj(versions, mask):
        n = len(versions)
        return Trajectory(task_id="t", token_ids=np.zeros(n, np.int32), loss_mask=np.asarray(mask, np.int8),
                          logprobs=np.zeros(n, np.float32), versions=np.asarray(versions, np.int32),
                          reward=0.0, status=TrajectoryStatus.OK)

    g = Group(group_id="g0", task_id="t", trajectories=(traj([-1, 3, 4], [0, 1, 1]), traj([-1, 5], [0, 1])))
    assert group_staleness(g, 6) == 3


def test_pipeline_config_rejects_bad_combinations():
    with pytest.raises(ValueError, match="max_staleness"):
        PipelineConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="publish_every"):
        PipelineConfig(max_staleness=0, publish_every=2)
    with pytest.raises(ValueError, match="filters"):
        PipelineConfig(filters=("nope",))
    with pytest.raises(ValueError, match="breaker_failure_rate"):
        PipelineConfig(breaker_failure_rate=0.0)
