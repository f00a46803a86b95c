"""Any Gymnasium environment as a text environment: CliffWalking-v1 with our own formatter
(observation -> text) and parser (text -> action).

Run: python examples/gymnasium_wrapper.py
"""

import asyncio
import re

from _loop import run_episode

from agentax.agents import ModelAgent
from agentax.agents.testing import ScriptedModel
from agentax.envs import GymnasiumEnvironment
from agentax.records import Task

MOVES = {"up": 0, "right": 1, "down": 2, "left": 3}


def describe(obs, gym_env):
    row, col = divmod(int(obs), 12)
    return f"You are at row {row}, column {col} of a 4x12 cliff. The goal is row 3, column 11."


def parse(text):
    words = re.findall(r"up|right|down|left", text.lower())
    return MOVES[words[-1]] if words else None


async def main():
    env = GymnasiumEnvironment(
        "CliffWalking-v1",
        formatter=describe,
        parser=parse,
        instructions="Walk along the cliff edge to the goal without falling. Moves: up, right, down, left.",
        action_help="Answer with up, right, down or left.",
        max_steps=30,
    )
    replies = ["up"] + ["right"] * 11 + ["down"]
    reward, last = await run_episode(env, ModelAgent(), ScriptedModel(replies), Task(id="cliff", meta={"seed": 0}))
    assert last.done and reward == -13.0  # 13 steps at -1 each, no fall


if __name__ == "__main__":
    asyncio.run(main())
