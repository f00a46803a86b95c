"""The calculator task as an agent written only against the `openai` SDK, trained unchanged.

`calculator_agent(client, task)` is an ordinary OpenAI tool loop: it offers a `calculator`
function, runs the calls the model makes with its own arithmetic, sends the results back, and
stops at the first reply without a tool call. Nothing in it knows about agentax; `make_env`
wraps it in an `OpenAIAgentEnvironment`, which points its `client` at the engine's endpoint
and records each episode token-exactly. `openai_calculator.yaml` trains it with `agentax train`
(see docs/openai.md); its prompts list the tool, so its warm start renders the demonstrations
with the same tool list (`make_agent`).

The tool is declared by name only. The endpoint renders whatever schema the agent sends into
every prompt, and the tiny byte-level model reads each byte as a token: the full schema
(description and parameters, as the native demo's tool has) is 179 tokens in front of a
~120-token episode, which tripled the warm start's cost. The name alone is 38 tokens; the
argument format (`{"expression": ...}`) is learnt from the demonstrations, as the native demo,
which lists no tools at all, learns it. Any tool list still slows the warm start, so the
recipe trains longer than the native demo (docs/openai.md has the measurements).
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Sequence
from typing import Any

from agentax.recipes import calculator as _native
from agentax.recipes._calculator import calculator_demos, calculator_reward
from agentax.recipes._tasks import PromptToolAgent
from agentax.records import Message, Task
from agentax.serve import OpenAIAgentEnvironment

__all__ = ["CALCULATOR_TOOL", "calculator_agent", "demos", "make_agent", "make_env", "tasks"]

CALCULATOR_TOOL = {"type": "function", "function": {"name": "calculator"}}
"""The tool the agent offers: by name only (every byte of a schema is a prompt token here)."""

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _arithmetic(expression: str) -> str:
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("only + - * of integers")

    try:
        return str(ev(ast.parse(expression.strip(), mode="eval")))
    except (SyntaxError, ValueError, RecursionError) as e:
        return f"Error: {e}"


async def calculator_agent(client: Any, task: Any, *, max_calls: int = 3,
                           tool: dict[str, Any] = CALCULATOR_TOOL) -> None:
    """The SDK agent: a plain chat-completions tool loop (the reward is judged afterwards).

    Args:
      client: an `openai.AsyncOpenAI`.
      task: the question (`task.prompt`).
      max_calls: model calls at most.
      tool: the calculator's schema as sent in every request (e.g. a full one with description
        and parameters, as `benchmarks/openai_endpoint.py` measures).
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for _ in range(max_calls):
        reply = await client.chat.completions.create(model="agentax", messages=messages,
                                                     tools=[tool])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            result = _arithmetic(str(expression)) if call.function.name == "calculator" else \
                f"Error: unknown tool {call.function.name}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


def make_env(**kwargs: Any) -> OpenAIAgentEnvironment:
    """The SDK agent as an environment; the reward is the calculator's exact-number check on
    its last reply without a tool call."""
    return OpenAIAgentEnvironment(calculator_agent, reward_fn=calculator_reward, **kwargs)


def make_agent(*, tool_format: str = "hermes") -> PromptToolAgent:
    """Not an agent of the episodes (the SDK agent is its own): it tells the warm start which
    tool list to render the demonstrations with, the one the SDK agent sends (and, like the
    SDK agent, no system prompt)."""
    return PromptToolAgent([CALCULATOR_TOOL], list_tools=True, tool_format=tool_format,
                           system_prompt="")


tasks = _native.tasks
"""The calculator demo's questions (training and held-out)."""

def demos(train_tasks: Sequence[Task], n: int, seed: int) -> list[list[Message]]:
    """The sloppy demonstrator (`DemoMix`'s defaults) calling this recipe's `calculator`."""
    return calculator_demos([train_tasks[i % len(train_tasks)] for i in range(n)], seed=seed)
