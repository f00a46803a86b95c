"""A bash task in a sandbox: the agent must leave the right file behind.

CodeEnvironment gives every episode a fresh confined sandbox holding the task's files, offers
a `bash` tool, and scores the final answer with a check that inspects the sandbox.

Run: python examples/bash_task.py
"""

import asyncio
import sys

from _loop import run_episode

from agentax.agents import ToolAgent
from agentax.agents.testing import ScriptedModel
from agentax.envs import CodeEnvironment
from agentax.records import Task
from agentax.tools import SandboxConfig, SandboxUnavailableError, check_sandbox_available

REPLIES = [
    '<tool_call>{"name": "bash", "arguments": {"command": "ls && sort -u names.txt > unique.txt && wc -l unique.txt"}}</tool_call>',
    "unique.txt now holds the 3 distinct names, sorted.",
]


def unique_file_ok(sandbox, task, answer):
    return float(sandbox.read_file("unique.txt").split() == ["ada", "grace", "linus"])


async def main():
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:
        print(f"skipped: {e}")
        return
    task = Task(
        id="bash-uniq",
        prompt="Write the distinct names of names.txt, sorted, one per line, to unique.txt.",
        meta={"files": {"names.txt": "grace\nada\nlinus\nada\n"}},
    )
    env = CodeEnvironment(check=unique_file_ok, tools=("bash",), sandbox_config=SandboxConfig(timeout_s=10))
    bash_schema = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                   "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
    reward, _ = await run_episode(env, ToolAgent([bash_schema]), ScriptedModel(REPLIES), task)
    assert reward == 1.0


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
