"""FrozenLake with a custom agent: grid-aware prompt and a forgiving action parser.

The scripted "model" answers in different styles (a word, a letter, a number, a tagged action,
one unreadable reply); FrozenLakeAgent reads them all, and the unreadable one comes back as
feedback instead of crashing the episode.

Run: python examples/frozen_lake_agent.py
"""

import asyncio

from _loop import run_episode

from agentax.agents import FrozenLakeAgent
from agentax.agents.testing import ScriptedModel
from agentax.envs import make_frozen_lake
from agentax.records import Task

REPLIES = [
    "The hole is to the right of row 1, so I go down first.\nAction: down",
    "D",
    "hmm, let me think",  # no action: the environment answers with feedback
    "move right",
    "2",
    "<action>down</action>",
    "Action: right",
]


async def main():
    env = make_frozen_lake(is_slippery=False, max_steps=20)
    agent = FrozenLakeAgent()
    reward, last = await run_episode(env, agent, ScriptedModel(REPLIES), Task(id="lake-0", meta={"seed": 0}))
    print(f"invalid replies: {agent.stats['invalid_actions']}")
    assert reward == 1.0 and last.done and agent.stats["invalid_actions"] == 1


if __name__ == "__main__":
    asyncio.run(main())
