"""The built-in calculator task: arithmetic questions, a calculator tool, and warm-start demos.

A question is `What is 37*48?` (two- or three-digit operands). The agent may call the
calculator — `<tool_call>{"name":"calc","arguments":{"expr":"37*48"}}</tool_call>` — read its
result, and answer with the number alone. The reward is 1 for the exact number.

Everything is byte-level and short on purpose (about 120 tokens an episode), so that the tiny
model learns it on two CPU cores in a minute or two.

The warm-start demonstrations are deliberately imperfect, like a sloppy human demonstrator:
for addition and subtraction it mostly trusts its mental arithmetic (answers without the tool,
and is often wrong), for multiplication it mostly uses the calculator, and it sometimes miscopies
the calculator's result. The warm-started policy is therefore mediocre: sampled, it gets a
little under half of the questions right (greedy decoding hides part of its sloppiness); RL
learns that calling the calculator and copying its result pays.

The mix is a trade-off the demo's budget forces: copying the tool's result (an induction-head
skill for the tiny model) only emerges after roughly 100 SFT updates with enough tool-using
demonstrations in each batch, so the demonstrator uses the tool on about half the questions.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from agentax.records import Message, Task, ToolCall
from agentax.tools import Tool, calculator

__all__ = [
    "CALCULATOR_OPS",
    "DemoMix",
    "calculator_demos",
    "calculator_reward",
    "calculator_tasks",
    "compact_calculator",
]

CALCULATOR_OPS = ("+", "-", "*")
"""Operators of the generated questions."""

def _calc(expr: str):
    return calculator.fn(expression=expr)


def compact_calculator() -> Tool:
    """`agentax.tools.calculator` as `calc(expr)` with a one-line description.

    Every byte is a token here, and the byte-level model must spell the call's fixed text: sampled
    at temperature 1 after RL, most failed episodes had misspelled `calculator` or `expression`
    ("calculats", "expresssion"). The short names have no repeated letters to miscount.
    """
    return dataclasses.replace(
        calculator,
        name="calc",
        description="Evaluates arithmetic.",
        parameters={"type": "object", "properties": {"expr": {"type": "string"}},
                    "required": ["expr"]},
        fn=_calc,
    )


def _operands(rng: random.Random, op: str, max_digits: int) -> tuple[int, int]:
    hi = 10**max_digits - 1
    if op == "*":  # keep products short: a 2-3 digit number times a 1-2 digit one
        return rng.randint(10, hi), rng.randint(2, 99)
    a, b = rng.randint(10, hi), rng.randint(10, hi)
    if op == "-" and b > a:
        a, b = b, a
    return a, b


def _answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def calculator_tasks(n: int, *, seed: int, max_digits: int = 2, prefix: str = "calc") -> list[Task]:
    """`n` distinct arithmetic questions (deterministic in `seed`).

    Args:
      n: number of tasks.
      seed: generator seed; use different seeds for training and held-out tasks (the held-out
        set is also filtered against the training set by the caller when it matters).
      max_digits: largest operand width (2 or 3).
      prefix: task id prefix.
    Returns:
      Tasks with `prompt` "What is A<op>B?" and `answer` the exact integer as a string.
    """
    if max_digits < 2:
        raise ValueError(f"max_digits must be >= 2, got {max_digits}")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[Task] = []
    while len(out) < n:
        op = rng.choice(CALCULATOR_OPS)
        a, b = _operands(rng, op, max_digits)
        expr = f"{a}{op}{b}"
        if expr in seen:
            continue
        seen.add(expr)
        out.append(Task(id=f"{prefix}-{len(out)}", prompt=f"What is {expr}?",
                        answer=str(_answer(a, op, b)), meta={"expression": expr, "op": op}))
    return out


def calculator_reward(task: Task, response: str) -> float:
    """1.0 when the reply is exactly the task's number (surrounding whitespace ignored)."""
    return 1.0 if response.strip() == str(task.answer) else 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoMix:
    """How the imperfect demonstrator behaves."""

    tool_rate_add: float = 0.3
    """Probability of calling the calculator on + and - questions."""
    tool_rate_mul: float = 0.95
    """Probability of calling the calculator on * questions."""
    miscopy_rate: float = 0.05
    """Probability of miscopying the calculator's result (one digit changed)."""
    guess_right_rate: float = 0.3
    """Probability that an answer without the tool is right (else a near miss)."""
    estimates: bool = False
    """Answers without the tool are estimates ("about 80"; never rewarded) instead of numbers.
    A near miss changes one digit at random, so under greedy decoding the likeliest digits
    spell the right number; an estimate starts with one token, so greedy can prefer it."""


def _near_miss(rng: random.Random, value: int) -> str:
    text = list(str(value))
    i = rng.randrange(len(text))
    choices = [d for d in "0123456789" if d != text[i] and not (i == 0 and d == "0" and len(text) > 1)]
    text[i] = rng.choice(choices)
    return "".join(text)


def calculator_demos(tasks: Sequence[Task], *, seed: int, mix: DemoMix = DemoMix(),
                     tool_name: str = "calculator", argument: str = "expression") -> list[list[Message]]:
    """One demonstration conversation per task (no system message), from the sloppy demonstrator.

    Tool-using demos: user question, assistant tool call, tool result, assistant answer.
    Direct demos: user question, assistant answer (right with `guess_right_rate`, or an
    estimate with `estimates`).
    `tool_name(argument=...)` is the call the demonstrator makes (`compact_calculator` is
    `calc(expr=...)`; the SDK recipe's tool is `calculator(expression=...)`).
    """
    rng = random.Random(seed)
    convs = []
    for i, task in enumerate(tasks):
        expr, op = task.meta["expression"], task.meta["op"]
        value = int(task.answer)
        user = Message(role="user", content=task.prompt)
        rate = mix.tool_rate_mul if op == "*" else mix.tool_rate_add
        if rng.random() < rate:
            call = ToolCall(name=tool_name, arguments={argument: expr}, id=f"call_{i}")
            answer = _near_miss(rng, value) if rng.random() < mix.miscopy_rate else str(value)
            convs.append([
                user,
                Message(role="assistant", content="", tool_calls=(call,)),
                Message(role="tool", content=str(value), name=tool_name, tool_call_id=call.id),
                Message(role="assistant", content=answer),
            ])
        else:
            if mix.estimates:
                answer = f"about {round(value, -1) if abs(value) >= 10 else value}"
            else:
                answer = str(value) if rng.random() < mix.guess_right_rate else _near_miss(rng, value)
            convs.append([user, Message(role="assistant", content=answer)])
    return convs
