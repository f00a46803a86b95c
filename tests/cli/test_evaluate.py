"""Held-out evaluation counts what ended each episode: errors, and cuts by the collector's limits."""

from __future__ import annotations

import asyncio
import dataclasses
import types

from agentax.agents import ModelAgent
from agentax.agents.testing import ScriptedEngine
from agentax.run._evaluate import evaluate
from agentax.envs import Environment
from agentax.records import Observation, SamplingParams, StepResult, Task
from agentax.rollout import CollectorConfig
from agentax.text import ByteTokenizer

TOK = ByteTokenizer()


class Guess(Environment):
    """Done (reward 1) when the reply is the answer; otherwise asks again, without end."""

    async def _reset(self, task):
        return Observation(content="Guess.")

    async def _step(self, action):
        if action.text.strip() == self.task.answer:
            return StepResult(observation=Observation(content="yes"), reward=1.0, done=True)
        return StepResult(observation=Observation(content="again"))


def test_the_eval_line_counts_episodes_cut_by_the_collector_limits():
    # The engine always answers "7": the tasks whose answer is 7 end at once, the others go on
    # until max_turns cuts them.
    tasks = [Task(id=f"t{i}", answer="7" if i % 4 == 0 else "3") for i in range(8)]
    suite = types.SimpleNamespace(make_env=Guess, make_agent=ModelAgent, reward_fn=None)
    greedy, sampled = asyncio.run(evaluate(
        ScriptedEngine(lambda text: "7", tokenizer=TOK), TOK, suite, tasks,
        sampling=SamplingParams(max_tokens=8), collector_config=CollectorConfig(max_turns=2),
        greedy=True, samples=2))
    assert (greedy.episodes, greedy.cut, greedy.failed) == (8, 6, 0)
    assert (sampled.episodes, sampled.cut) == (16, 12) and sampled.success_rate == 0.25
    assert "(8 episodes, 0 failed, 6 cut short by collector limits, " in greedy.line()
    assert sampled.to_metrics()["eval/sampled/cut_short"] == 12  # summary.json, metrics.jsonl
    assert "cut short" not in dataclasses.replace(greedy, cut=0).line()


def test_a_metric_an_episode_does_not_report_counts_as_absent_not_as_present():
    from agentax.run._evaluate import aggregate

    # `hole` is reported only by the episode that fell in one: a rate of 1/4, not 1.0.
    episodes = [{"success": 1.0, "moves": 4.0}, {"success": 0.0, "hole": 1.0, "moves": 2.0},
                {"success": 0.0, "moves": 3.0}, {"success": 1.0, "moves": 5.0}]
    assert aggregate(episodes) == {"success": 0.5, "hole": 0.25, "moves": 3.5}
    # A step where no episode reports it has no value for it (not 0, not an earlier one).
    assert "hole" not in aggregate([{"success": 1.0}, {"success": 0.0}])
    assert aggregate([]) == {}
