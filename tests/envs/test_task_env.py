"""TaskEnvironment: single-turn scoring with agentax.rewards, and failing reward functions."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentax.agents import ModelAgent
from agentax.envs import EnvError, TaskEnvironment
from agentax.records import Action, Task, TrajectoryStatus
from agentax.rewards import math_verify

TASK = Task(id="m1", prompt="What is 3/4 + 1/4 + 1,000?", answer="1001")


@pytest.mark.parametrize("reply, reward", [("So the answer is \\boxed{1,001}.", 1.0), ("\\boxed{1000}", 0.0)])
def test_math_single_turn(episode, reply, reward):
    env = TaskEnvironment(math_verify)
    traj, last, _ = episode(env, ModelAgent(system_prompt="Put the answer in \\boxed{}."), [reply], TASK)
    assert traj.status is TrajectoryStatus.OK and last.done and not last.truncated and traj.reward == reward


def test_reward_by_name_and_prompt_fn():
    env = TaskEnvironment("exact_match", prompt_fn=lambda t: f"Q: {t.prompt}\nA:")

    async def go():
        obs = await env.reset(Task(id="e", prompt="capital of France?", answer="Paris"))
        return obs, await env.step(Action(text="paris"))

    obs, res = asyncio.run(go())
    assert obs.content == "Q: capital of France?\nA:" and res.reward == 1.0


def test_sync_reward_runs_in_a_worker_thread():
    seen = []

    def reward(task, response):
        seen.append(threading.current_thread() is threading.main_thread())
        return 0.5

    async def go():
        env = TaskEnvironment(reward)
        await env.reset(TASK)
        return await env.step(Action(text="x"))

    assert asyncio.run(go()).reward == 0.5 and seen == [False]


@pytest.mark.parametrize(
    "fn, kind",
    [
        (lambda t, r: 1 / 0, "reward_error"),
        (lambda t, r: float("nan"), "reward_error"),
        (lambda t, r: "great", "reward_error"),
    ],
)
def test_failing_rewards_end_as_reward_error(fn, kind):
    async def go():
        env = TaskEnvironment(fn)
        await env.reset(TASK)
        with pytest.raises(EnvError) as e:
            await env.step(Action(text="x"))
        return env, e.value

    env, err = asyncio.run(go())
    assert err.status is TrajectoryStatus.REWARD_ERROR and err.kind == kind
    assert env.stats["errors"] == 1


def test_hanging_async_reward_times_out():
    async def never(task, response):
        await asyncio.sleep(10)

    async def go():
        env = TaskEnvironment(never, reward_timeout_s=0.05)
        await env.reset(TASK)
        with pytest.raises(EnvError) as e:
            await env.step(Action(text="x"))
        return e.value

    assert asyncio.run(go()).kind == "reward_timeout"


def test_bad_reward_argument_is_a_clear_error():
    with pytest.raises(TypeError, match="reward_fn must be"):
        TaskEnvironment(42)
