"""Single-turn math: TaskEnvironment + math_verify reward + a plain ModelAgent.

Run: python examples/math_single_turn.py
"""

import asyncio

from _loop import run_episode

from agentax.agents import ModelAgent
from agentax.agents.testing import ScriptedModel
from agentax.envs import TaskEnvironment
from agentax.records import Task
from agentax.rewards import math_verify


async def main():
    task = Task(id="gsm-1", prompt="A box holds 12 eggs. How many eggs are in 7 boxes?", answer="84")
    agent = ModelAgent(system_prompt="Solve the problem. Put the final answer in \\boxed{}.")
    for reply in ["12 * 7 = 84, so \\boxed{84}.", "I think \\boxed{72}."]:
        env = TaskEnvironment(math_verify)
        reward, _ = await run_episode(env, agent, ScriptedModel([reply]), task)
        assert reward == (1.0 if "84}" in reply else 0.0)


if __name__ == "__main__":
    asyncio.run(main())
