"""The calculator task as an OpenAI Agents SDK agent, trained unchanged (`agents_sdk_calculator`).

The agent is ordinary Agents SDK code: an `agents.Agent` with one `function_tool` (`calc`), the
model an `OpenAIChatCompletionsModel` over the `openai.AsyncOpenAI` client the environment
hands it, `tool_choice="required"` (the SDK resets it to auto after the first tool call, so the
second call can answer), `parallel_tool_calls=True`, and `output_type=int`: the SDK asks for a
`json_schema` reply `{"response": <int>}` and parses it. `Runner.run` drives the episode
(at most `MAX_TURNS` model calls); nothing in it knows about agentax. `make_env` wraps it in an
`OpenAIAgentEnvironment`, which points the client at the engine's endpoint and records each
episode token-exactly; SDK exceptions end the episode with a status of their own
(`MaxTurnsExceeded`: truncated; `ModelBehaviorError`, e.g. an unknown tool or an output that
does not parse: a finished episode with reward 0; see `agentax.serve.AGENT_OUTCOMES`).

Everything is short on purpose, for the tiny byte-level model (every byte is a token): the
instructions are one line, and the tool's parameter schema, which the SDK derives from the
function's signature (~110 bytes of titles and `required`), is set to `{}` after decoration (the
argument format, `{"expr": ...}`, is learnt from the demonstrations, as in `openai_calculator`,
whose tool is listed by name only). A prompt is then ~100 tokens of instructions and tool list
plus the question, instead of the ~335 the SDK's defaults (docstring, full schema) gave.

The warm start renders the demonstrations exactly as the SDK's requests render: the
instructions as the system message (`demos`) and the SDK's own tool list (`make_agent`, from
`tool_schemas()`), through `agentax.recipes.render_examples`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from agentax.recipes import calculator as _native
from agentax.recipes._calculator import _near_miss
from agentax.recipes._tasks import PromptToolAgent
from agentax.recipes.openai_calculator import _arithmetic
from agentax.records import Message, Task, ToolCall
from agentax.serve import OpenAIAgentEnvironment, Reward

__all__ = ["INSTRUCTIONS", "MAX_TURNS", "build_agent", "demos", "make_agent", "make_env",
           "run_agent", "tasks", "tool_schemas"]

INSTRUCTIONS = "Use calc."
"""The agent's `instructions` (the SDK sends them as the system message of every call)."""

MAX_TURNS = 3
"""`Runner.run(max_turns=...)`: model calls an episode may make."""

MISCOPY_RATE = 0.2
"""Demonstrations whose answer miscopies the tool's result by one digit (a sloppy start that
RL improves on)."""


def _need_sdk() -> None:
    try:
        import agents  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the install
        raise ImportError("the agents_sdk_calculator recipe needs the OpenAI Agents SDK: "
                          "pip install 'agentax[agents]'") from None


def _calc_tool() -> Any:
    """The `calc(expr)` function tool, its schema cut to `{}` (see the module docstring)."""
    from agents import function_tool

    def calc(expr: str) -> str:
        return _arithmetic(expr)

    tool = function_tool(calc, use_docstring_info=False, strict_mode=False)
    return dataclasses.replace(tool, params_json_schema={})


def build_agent(client: Any) -> Any:
    """The Agents SDK agent, its model the chat-completions endpoint behind `client`."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel

    return Agent(
        name="calculator", instructions=INSTRUCTIONS, tools=[_calc_tool()], output_type=int,
        model=OpenAIChatCompletionsModel(model="agentax", openai_client=client),
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=True),
    )


async def run_agent(client: Any, task: Task) -> Reward:
    """One episode: `Runner.run` on the question; the reward is 1 for the exact number."""
    from agents import RunConfig, Runner

    result = await Runner.run(build_agent(client), task.prompt, max_turns=MAX_TURNS,
                              run_config=RunConfig(tracing_disabled=True))
    return Reward(1.0 if str(result.final_output) == str(task.answer) else 0.0)


def make_env(**kwargs: Any) -> OpenAIAgentEnvironment:
    """The SDK agent as an environment (kwargs: `OpenAIAgentEnvironment`'s)."""
    _need_sdk()
    return OpenAIAgentEnvironment(run_agent, **kwargs)


def tool_schemas() -> list[dict[str, Any]]:
    """The tool list as the SDK sends it (`OpenAIChatCompletionsModel`'s own conversion)."""
    _need_sdk()
    from agents.models.chatcmpl_converter import Converter

    return [Converter.tool_to_openai(_calc_tool())]


def make_agent(*, tool_format: str = "hermes") -> PromptToolAgent:
    """Not an agent of the episodes (the SDK agent is its own): it gives the warm start the
    SDK's tool list and instructions, so demonstrations render as the SDK's requests do."""
    return PromptToolAgent(tool_schemas(), list_tools=True, tool_format=tool_format,
                           system_prompt=INSTRUCTIONS)


tasks = _native.tasks
"""The calculator demo's questions (training and held-out)."""


def demos(train_tasks: Sequence[Task], n: int, seed: int) -> list[list[Message]]:
    """What the SDK agent's episodes look like when it does right, with some sloppiness: the
    instructions, the question, a `calc` call (tool_choice is required), its result, and the
    answer as the `output_type` JSON; `MISCOPY_RATE` of the answers change one digit."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = train_tasks[i % len(train_tasks)]
        value = int(task.answer)
        call = ToolCall(name="calc", arguments={"expr": task.meta["expression"]}, id=f"call_{i}")
        answer = _near_miss(rng, value) if rng.random() < MISCOPY_RATE else str(value)
        out.append([
            Message(role="system", content=INSTRUCTIONS),
            Message(role="user", content=task.prompt),
            Message(role="assistant", content="", tool_calls=(call,)),
            Message(role="tool", content=str(value), name="calc", tool_call_id=call.id),
            Message(role="assistant", content='{"response":' + answer + "}"),
        ])
    return out
