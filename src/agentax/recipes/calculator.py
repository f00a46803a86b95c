"""The calculator recipe's parts, named by import path in `calculator.yaml` (the embedded demo).

`make_env`, `make_agent`, `tasks` and `demos` are exactly what a user's own package provides
for `env.factory`, `agent.factory`, `tasks.factory` and `sft.demos`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agentax.envs import ToolEnvironment
from agentax.records import Action, Message, StepResult, Task
from agentax.recipes._calculator import (
    DemoMix,
    calculator_demos,
    calculator_reward,
    calculator_tasks,
    compact_calculator,
)
from agentax.recipes._tasks import PromptToolAgent

__all__ = ["DEMO_MIX", "CalculatorEnvironment", "demos", "make_agent", "make_env", "tasks"]

DEMO_MIX = DemoMix(tool_rate_add=0.3, tool_rate_mul=0.95, miscopy_rate=0.0, estimates=True)
"""The demo's demonstrator: it calls the calculator on almost every * question but on only 30 %
of the +/- ones, which it estimates in its head ("about 80": never rewarded). So the warm start
is sloppy in its *decision*, under greedy decoding too: on +/- questions a one-token estimate
beats the tool call, whereas answers from memory written as numbers (near misses) spread their
first token over ten digits and lost to the call, which left greedy at 84-95 % before RL. It
copies the tool's result faithfully: copying is a skill the tiny model must acquire during the
warm start (it emerges late in SFT, at a seed-dependent step): demonstrations that miscopy on
purpose left seed 0 or 2 of the one-minute demo with a policy that RL could not fix in 40
steps; 53 % tool-using ones suffice for seeds 0-2. Calling the
tool on - questions too (73 %) made RL twice as slow: most groups were then all right and
filtered as equal-reward."""


class CalculatorEnvironment(ToolEnvironment):
    """The calculator tool environment; reports `tool_use` (1 if the episode called a tool)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__([compact_calculator()], calculator_reward, **kwargs)
        self._used_tool = False

    async def _reset(self, task: Task):
        self._used_tool = False
        return await super()._reset(task)

    async def _step(self, action: Action) -> StepResult:
        self._used_tool = self._used_tool or bool(action.tool_calls)
        result = await super()._step(action)
        metrics = {**dict(result.info.get("metrics", {})), "tool_use": float(self._used_tool)}
        return dataclasses.replace(result, info={**result.info, "metrics": metrics})


def make_env(**kwargs: Any) -> CalculatorEnvironment:
    """A fresh calculator environment (kwargs: `ToolEnvironment` limits such as max_steps)."""
    return CalculatorEnvironment(**kwargs)


def make_agent(*, list_tools: bool = False, tool_format: str = "hermes",
               system_prompt: str = "") -> PromptToolAgent:
    """The demo's agent: no system prompt and no tool list (every byte is a token here)."""
    return PromptToolAgent([compact_calculator()], list_tools=list_tools, tool_format=tool_format,
                           system_prompt=system_prompt)


def tasks(*, num_train: int, num_eval: int, seed: int,
          max_digits: int = 2) -> tuple[list[Task], list[Task]]:
    """Distinct generated questions; the held-out ones never appear in training."""
    pool = calculator_tasks(num_train + num_eval, seed=seed, max_digits=max_digits)
    return pool[:num_train], pool[num_train:]


def demos(train_tasks: Sequence[Task], n: int, seed: int) -> list[list[Message]]:
    """The sloppy demonstrator on training questions (cycled when n is larger)."""
    picked = [train_tasks[i % len(train_tasks)] for i in range(n)]
    tool = compact_calculator()
    (argument,) = tool.parameters["properties"]
    return calculator_demos(picked, seed=seed, mix=DEMO_MIX, tool_name=tool.name, argument=argument)
