"""`SWEAgent`: a tool agent with a software-engineering workflow prompt (use with SWEEnvironment).

Subclassing example: only the system prompt and the observation formatting change. Long tool
outputs (test logs) are already cut by the tools; the agent adds a reminder of the workflow
after each failing test run so a small model keeps its bearings.
"""

from __future__ import annotations

from typing import Any

from agentax.agents._tool import ToolAgent
from agentax.envs import SWEEnvironment
from agentax.records import Message, Observation

__all__ = ["SWEAgent"]


class SWEAgent(ToolAgent):
    """Fixes bugs in a repository with list/read/search/edit/run_tests tools.

    Args:
      tools: the environment's tool schemas; default `SWEEnvironment.tool_schemas()`.
      tool_format: "hermes" (Qwen-style) or "llama3".
    """

    system_prompt = (
        "You are a careful software engineer working in a Python repository. Work in small steps: "
        "1) find the relevant code with search / list_files, 2) read it with read_file, 3) make the "
        "smallest fix with replace_in_file, 4) run run_tests. Never edit the tests. When the tests "
        "pass, reply with a one-line summary of your fix and no tool call."
    )

    def __init__(self, tools: Any = None, *, tool_format: str = "hermes", system_prompt: str | None = None) -> None:
        if tools is None:
            tools = SWEEnvironment.tool_schemas()
        super().__init__(tools, tool_format=tool_format, system_prompt=system_prompt)

    def format_observation(self, observation: Observation) -> list[Message]:
        messages = super().format_observation(observation)
        failed = [r for r in observation.tool_results if r.name == "run_tests" and not r.ok]
        if failed:
            messages.append(
                Message(role="user", content="The tests still fail. Read the failure, fix the code, and run the tests again.")
            )
        return messages
