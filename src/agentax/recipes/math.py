"""Math recipes' parts: generated arithmetic for the tiny model, and math with the calculator.

Single-turn math needs no environment or agent of its own: `env.factory:
agentax.envs:TaskEnvironment` with `env.kwargs: {reward_fn: math_verify}` and `agent.factory:
agentax.agents:ModelAgent`; the `math` recipe adds generated questions (`arithmetic_tasks`)
and a sloppy demonstrator (`arithmetic_demos`), the GSM8K recipes read JSONL files.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from agentax.envs import ToolEnvironment
from agentax.records import Message, Task
from agentax.recipes._tasks import PromptToolAgent
from agentax.tools import calculator

__all__ = ["MATH_SYSTEM_PROMPT", "MATH_TOOL_SYSTEM_PROMPT", "arithmetic_demos", "arithmetic_tasks",
           "make_tool_agent", "make_tool_env"]

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


def arithmetic_tasks(*, num_train: int, num_eval: int, seed: int,
                     max_operand: int = 99) -> tuple[list[Task], list[Task]]:
    """Distinct 'A+B=' / 'A-B=' questions, a two-digit A and a one-digit B with no carry or
    borrow (the tiny model learns a digit table, not long addition), scored by math_verify;
    held-out questions are never trained on."""
    possible = 2 * 55 * (max_operand // 10 - 1 + (max_operand % 10 + 1) / 10)
    if num_train + num_eval > possible:
        raise ValueError(f"only about {int(possible)} distinct questions exist; lower num_train")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[Task] = []
    while len(out) < num_train + num_eval:
        a, b, op = rng.randint(10, max_operand), rng.randint(0, 9), rng.choice("+-")
        question = f"{a}{op}{b}="
        if question in seen or not (0 <= (a % 10 + b if op == "+" else a % 10 - b) <= 9):
            continue
        seen.add(question)
        out.append(Task(id=f"arith-{len(out)}", prompt=question,
                        answer=str(a + b if op == "+" else a - b)))
    return out[:num_train], out[num_train:]


def arithmetic_demos(train_tasks: Sequence[Task], n: int, seed: int, *,
                     right_rate: float = 0.5) -> list[list[Message]]:
    """A sloppy demonstrator: the right number with probability `right_rate`, else off by
    one or ten."""
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        task = train_tasks[i % len(train_tasks)]
        value = int(task.answer)
        if rng.random() >= right_rate:
            value += rng.choice((-10, -1, 1, 10))
        convs.append([Message(role="user", content=task.prompt),
                      Message(role="assistant", content=str(value))])
    return convs
