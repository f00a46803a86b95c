"""Gymnasium wrapper on real FrozenLake-v1 / Taxi-v4 / CartPole-v1, with forgiving parsers."""

from __future__ import annotations

import asyncio
from collections import deque

import gymnasium as gym
import numpy as np
import pytest

from agentax.agents import FrozenLakeAgent, ModelAgent
from agentax.envs import EnvError, GymnasiumEnvironment, make_frozen_lake, make_taxi
from agentax.envs._gym import TAXI_ACTIONS, parse_frozen_lake_action, parse_taxi_action
from agentax.records import Action, Task, TrajectoryStatus


def test_registered_ids_exist():
    assert "FrozenLake-v1" in gym.registry and "Taxi-v4" in gym.registry


@pytest.mark.parametrize(
    "text, expected",
    [
        ("left", 0), ("L", 0), ("0", 0), ("move left", 0), ("Move LEFT.", 0),
        ("I will go down", 1), ("d", 1), ("Action: down", 1), ("↓", 1),
        ("Thinking: not up, the hole is there.\nAction: right", 2), ("<action>up</action>", 3),
        ("\\boxed{2}", 2), ("it's down", 1), ("east", 2), ("north", 3),
        ("banana", None), ("", None), ("7", None),
    ],
)  # fmt: skip
def test_frozen_lake_parser_is_forgiving(text, expected):
    assert parse_frozen_lake_action(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [("south", 0), ("go north", 1), ("right", 2), ("Action: west", 3), ("pick up", 4), ("pickup", 4),
     ("Drop off the passenger", 5), ("5", 5), ("fly", None)],
)  # fmt: skip
def test_taxi_parser(text, expected):
    assert parse_taxi_action(text) == expected


def test_frozen_lake_custom_agent_reaches_goal(episode):
    # 4x4 non-slippery map: S FFF / F H F H / F F F H / H F F G
    replies = ["Action: down", "I go D", "move right", "2", "<action>down</action>", "Right!"]
    agent = FrozenLakeAgent()
    env = make_frozen_lake()
    traj, last, engine = episode(env, agent, replies, Task(id="fl", meta={"seed": 0}))
    assert traj.status is TrajectoryStatus.OK and last.done and not last.truncated
    assert traj.reward == 1.0 and engine.calls == 6
    first = agent.messages[1]  # what the model saw first: the map and the question
    assert first.role == "user" and "P" in first.content and "Which way" in first.content
    assert agent.messages[0].role == "system" and "FrozenLake" in agent.messages[0].content


def test_invalid_action_is_feedback_not_crash(episode):
    env = make_frozen_lake(max_steps=3)
    agent = FrozenLakeAgent()
    traj, last, _ = episode(env, agent, ["I refuse", "jump", "fly"], Task(id="fl"))
    assert traj.status is TrajectoryStatus.TRUNCATED and traj.info["reason"] == "env_truncated"
    assert last.truncated and last.done and last.info["invalid_action"]
    assert env.invalid_actions == 3 and agent.stats["invalid_actions"] == 3
    # the feedback names the problem and the valid actions, and shows the unchanged grid
    fb = agent.messages[-2].content
    assert "Invalid action" in fb and "left, down, right, up" in fb and fb.count("P") >= 1
    assert traj.reward == 0.0


def _taxi_plan(env: gym.Env, state: int) -> list[int]:
    """Shortest action sequence to a successful drop-off, by BFS over Taxi's transition table."""
    P = env.unwrapped.P
    prev = {state: None}
    queue = deque([state])
    while queue:
        s = queue.popleft()
        for a in range(6):
            _, nxt, reward, done = P[s][a][0]
            if done and reward > 0:
                plan = [a]
                while prev[s] is not None:
                    s, a0 = prev[s]
                    plan.append(a0)
                return plan[::-1]
            if nxt not in prev:
                prev[nxt] = (s, a)
                queue.append(nxt)
    raise AssertionError("no plan")


def test_taxi_solved_through_text(episode):
    env = make_taxi()
    first = asyncio.run(env.reset(Task(id="taxi", meta={"seed": 3})))
    plan = _taxi_plan(env.gym_env, int(first.raw))
    assert "T" in first.content and "destination" in first.content
    replies = [f"I will {TAXI_ACTIONS[a]}." for a in plan]
    traj, last, _ = episode(make_taxi(), ModelAgent(), replies, Task(id="taxi", meta={"seed": 3}))
    assert traj.status is TrajectoryStatus.OK and last.done and not last.truncated
    assert traj.reward == pytest.approx(20 - (len(plan) - 1))


def test_generic_wrapper_default_parser_and_action_value():
    async def go():
        env = GymnasiumEnvironment("CartPole-v1", instructions="Balance the pole.")
        obs = await env.reset(Task(id="cp", meta={"seed": 1}))
        r1 = await env.step(Action(text="push 1"))
        r2 = await env.step(Action(text="ignored", value=0))  # a ready action skips the parser
        r3 = await env.step(Action(text="push 5"))  # out of range -> feedback
        return env, obs, r1, r2, r3

    env, obs, r1, r2, r3 = asyncio.run(go())
    assert obs.content.startswith("Balance the pole.") and isinstance(obs.raw, np.ndarray)
    assert r1.info["action"] == 1 and r2.info["action"] == 0 and r1.reward == 1.0
    assert r3.info["invalid_action"] and "integer from 0 to 1" in r3.observation.content
    assert env.max_steps == 500  # taken from the gym spec


def test_box_space_needs_a_parser():
    with pytest.raises(TypeError, match="parser="):
        GymnasiumEnvironment("Pendulum-v1")


class ExplodingEnv(gym.Env):
    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return 0, {}

    def step(self, action):
        raise RuntimeError("physics engine exploded")


def test_gym_env_that_raises_is_env_error_and_parser_bug_is_feedback():
    def bad_parser(text):
        raise KeyError(text)

    async def go():
        env = GymnasiumEnvironment(ExplodingEnv())
        await env.reset(Task(id="x"))
        with pytest.raises(EnvError) as e:
            await env.step(Action(text="1"))
        env2 = GymnasiumEnvironment(ExplodingEnv(), parser=bad_parser)
        await env2.reset(Task(id="x"))
        return e.value, await env2.step(Action(text="1"))

    err, res = asyncio.run(go())
    assert err.status is TrajectoryStatus.ENV_ERROR and "exploded" in err.message
    assert res.info["invalid_action"] and "KeyError" in res.info["parser_error"]


def test_threaded_gym_env_times_out():
    import time

    class SlowEnv(ExplodingEnv):
        def step(self, action):
            time.sleep(0.5)
            return 0, 0.0, False, False, {}

    async def go():
        env = GymnasiumEnvironment(SlowEnv(), threaded=True, step_timeout_s=0.05)
        await env.reset(Task(id="x"))
        with pytest.raises(EnvError) as e:
            await env.step(Action(text="1"))
        await env.close()
        return e.value

    assert asyncio.run(go()).status is TrajectoryStatus.TIMEOUT
