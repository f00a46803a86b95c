"""Software engineering: fix a bug in a small repository until its tests pass.

SWEEnvironment copies one of three built-in repositories into a sandbox and offers file tools
(list_files, read_file, search, write_file, replace_in_file) and run_tests; the reward is 1.0
when the test suite passes after the agent's final answer.

Run: python examples/swe_task.py
"""

import asyncio
import json

from _loop import run_episode

from agentax.agents import SWEAgent
from agentax.agents.testing import ScriptedModel
from agentax.envs import SWEEnvironment, swe_tasks
from agentax.tools import SandboxUnavailableError, check_sandbox_available


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


REPLIES = [
    call("run_tests"),
    call("search", pattern="def word_count"),
    call("read_file", path="textstats/core.py"),
    call("replace_in_file", path="textstats/core.py", old='text.split(" ")', new="text.split()"),
    call("run_tests"),
    "word_count now splits on any whitespace run, so repeated spaces and newlines count correctly.",
]


async def main():
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:
        print(f"skipped: {e}")
        return
    (task,) = swe_tasks(["textstats"])
    env = SWEEnvironment(max_steps=10)
    reward, last = await run_episode(env, SWEAgent(), ScriptedModel(REPLIES), task)
    print(last.info["test_output"].strip().splitlines()[-1])
    assert reward == 1.0 and last.info["tests_passed"]


if __name__ == "__main__":
    asyncio.run(main())
