"""Math recipes' parts: a tool environment and agent for math with the calculator tool.

Single-turn math needs nothing of its own: `env.factory: agentax.envs:TaskEnvironment` with
`env.kwargs: {reward_fn: math_verify}` and `agent.factory: agentax.agents:ModelAgent`.
"""

from __future__ import annotations

from typing import Any

from agentax.envs import ToolEnvironment
from agentax.recipes._tasks import PromptToolAgent
from agentax.tools import calculator

__all__ = ["MATH_SYSTEM_PROMPT", "MATH_TOOL_SYSTEM_PROMPT", "make_tool_agent", "make_tool_env"]

MATH_SYSTEM_PROMPT = "Solve the math problem step by step. Put the final answer in \\boxed{}."
MATH_TOOL_SYSTEM_PROMPT = (
    "Solve the math problem. Use the calculator tool for arithmetic. Put the final answer in "
    "\\boxed{}."
)


def make_tool_env(*, reward: str = "math_verify", **kwargs: Any) -> ToolEnvironment:
    """Math with the calculator tool, scored by a registered reward (kwargs: env limits)."""
    return ToolEnvironment([calculator], reward, **kwargs)


def make_tool_agent(*, tool_format: str = "hermes", list_tools: bool = True,
                    system_prompt: str = MATH_TOOL_SYSTEM_PROMPT) -> PromptToolAgent:
    """A tool-calling agent offering the calculator."""
    return PromptToolAgent([calculator], list_tools=list_tools, tool_format=tool_format,
                           system_prompt=system_prompt)
