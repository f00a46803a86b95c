"""A multi-agent task through the pipeline: the trainer gets one GRPO group per (task, role),
filters judge each role's group on its own, failures sink the task's groups, and the books
(counted in trajectories) balance. Scripted models and a recording trainer: no JAX."""

from __future__ import annotations

import itertools

import pytest

from agentax.agents import ModelAgent
from agentax.agents.testing import ScriptedEngine
from agentax.envs import MultiAgentEnvironment, RoleStep
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import Observation, SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer

TOK = ByteTokenizer()


class Duel(MultiAgentEnvironment):
    """"a" then "b" reply once each; a earns a reply-dependent reward, b always 1 (so b's
    groups are all-equal), unless the task says b's step fails."""

    roles = ("a", "b")

    async def _reset(self, task):
        self.task_ = task
        return RoleStep(observations={"a": Observation(content=f"a:{task.id}")}, next_role="a")

    async def _step(self, role, action):
        if role == "a":
            return RoleStep(observations={"b": Observation(content=f"b:{action.text}")},
                            rewards={"a": float(len(action.text))}, next_role="b")
        if self.task_.meta.get("fail"):
            raise RuntimeError("b's step broke")
        return RoleStep(rewards={"b": 1.0}, done=True)


class Recorder:
    def __init__(self):
        self.steps = []

    def step(self, groups):
        self.steps.append([(g.group_id, [t.info["role"] for t in g.trajectories]) for g in groups])
        return {}


def build(tasks, *, filters=(), mode="async"):
    counter = itertools.count()
    engine = ScriptedEngine(lambda text: "x" * (1 + next(counter) % 3), tokenizer=TOK)
    collector = Collector(engine, TOK, Duel, ModelAgent, SamplingParams(max_tokens=8),
                          CollectorConfig(max_turns=4, max_episode_tokens=512))
    trainer = Recorder()
    pipe = Pipeline(collector, trainer, engine, tasks,
                    PipelineConfig(mode=mode, group_size=3, groups_per_step=2, max_staleness=1,
                                   max_concurrency=6, filters=list(filters)),
                    publish=lambda *a: None, data_shard=(0, 1))
    return pipe, trainer, engine


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_each_role_is_its_own_group_and_the_books_balance(mode):
    pipe, trainer, engine = build([Task(id="t0"), Task(id="t1")], mode=mode)
    result = pipe.run(2)
    assert len(trainer.steps) == 2
    for step in trainer.steps:
        ids = [gid for gid, _ in step]
        assert len(ids) == 4 and all(gid.endswith(("/a", "/b")) for gid in ids)
        for gid, roles in step:
            assert roles == [gid[-1]] * 3  # group_size trajectories, all of that role
    acc = result.accounting
    assert acc.trained == 2 * 2 * 3 * 2  # steps x tasks x samples x roles
    # async mode rolls ahead: what is left at the end is counted too, per trajectory
    assert acc.started == acc.trained + acc.num_filtered + acc.num_failed
    assert acc.in_flight == 0 and engine.live_sequences == set()


def test_filters_judge_each_role_group_and_failures_sink_the_task():
    tasks = [Task(id="ok"), Task(id="bad", meta={"fail": True})]
    pipe, trainer, _ = build(tasks, filters=["all_equal_rewards"])
    result = pipe.run(1)
    acc = result.accounting
    # b's groups are all-equal (dropped by the filter), a's train; "bad" fails as a whole
    assert all(gid.endswith("/a") for gid, _ in trainer.steps[0])
    assert acc.filtered["all_equal_rewards"] > 0 and acc.failed["env_error"] > 0
    assert acc.started == acc.trained + acc.num_filtered + acc.num_failed
    # every "ok" task lost its b group to the filter and kept its a group (trained or left over)
    assert acc.filtered["all_equal_rewards"] == acc.trained + acc.filtered["unconsumed_at_end"]
