"""The mcp_tools recipe's parts: an agent that learns to use a tool of an MCP server.

The tool lives in a real MCP server process (`agentax.recipes._mcp_server`, stdio, written with
the `mcp` SDK): `code(key)` answers the secret four-digit code of a key such as `ab37`, which
no model can work out. A task asks `Code of ab37?`; the reward is 1 for the exact code. The
environment and the agent reach the server only through `mcp_servers`, as any MCP server
would be named in a config:

    env:   {factory: agentax.recipes.mcp_tools:make_env,
            kwargs: {mcp_servers: [{command: python, args: [-m, agentax.recipes._mcp_server]}]}}

The warm-start demonstrator is sloppy like the calculator demo's: it calls the tool on almost
every key starting with a-m but on only 30 % of the others, where it guesses ("maybe 4821",
never right), so RL has the decision to learn: call the tool every time, and copy its answer.
"""

from __future__ import annotations

import dataclasses
import random
import string
from collections.abc import Sequence
from typing import Any

from agentax.envs import ToolEnvironment
from agentax.records import Action, Message, StepResult, Task, ToolCall
from agentax.recipes._mcp_server import secret_code
from agentax.recipes._tasks import PromptToolAgent

__all__ = ["SERVERS", "CodeLookupEnvironment", "code_reward", "demos", "make_agent", "make_env",
           "tasks"]

SERVERS = ({"command": "python", "args": ["-m", "agentax.recipes._mcp_server"]},)
"""The recipe's MCP server (`python` is the interpreter agentax runs on)."""

TOOL, ARGUMENT = "code", "key"
"""The server's tool and its argument (what the demonstrator calls)."""

TOOL_RATE_EARLY, TOOL_RATE_LATE = 0.95, 0.3
"""The demonstrator's probability of calling the tool on keys starting with a-m / n-z."""


def code_reward(task: Task, response: str) -> float:
    """1.0 when the reply is exactly the key's code (surrounding whitespace ignored)."""
    return 1.0 if response.strip() == str(task.answer) else 0.0


class CodeLookupEnvironment(ToolEnvironment):
    """A `ToolEnvironment` whose only tools come from MCP servers; reports `tool_use` (1 if
    the episode called a tool)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(None, code_reward, **kwargs)
        self._used_tool = False

    async def _reset(self, task: Task):
        self._used_tool = False
        return await super()._reset(task)

    async def _step(self, action: Action) -> StepResult:
        self._used_tool = self._used_tool or bool(action.tool_calls)
        result = await super()._step(action)
        metrics = {**dict(result.info.get("metrics", {})), "tool_use": float(self._used_tool)}
        return dataclasses.replace(result, info={**result.info, "metrics": metrics})


def make_env(*, mcp_servers: Sequence[Any] = SERVERS, **kwargs: Any) -> CodeLookupEnvironment:
    """The environment, offering the tools of `mcp_servers` (kwargs: `ToolEnvironment`'s)."""
    return CodeLookupEnvironment(mcp_servers=mcp_servers, **kwargs)


def make_agent(*, mcp_servers: Sequence[Any] = SERVERS, list_tools: bool = False,
               tool_format: str = "hermes", system_prompt: str = "") -> PromptToolAgent:
    """A tool agent offering the servers' tools. `list_tools=False` (the recipe's) leaves their
    schemas out of the prompt: every byte is a token for the tiny model, and the server's
    schema alone is ~200 bytes; with a real model, list them."""
    return PromptToolAgent(None, mcp_servers=mcp_servers, list_tools=list_tools,
                           tool_format=tool_format, system_prompt=system_prompt)


def _keys(rng: random.Random):
    letters = string.ascii_lowercase
    while True:
        yield f"{rng.choice(letters)}{rng.choice(letters)}{rng.randrange(100):02d}"


def tasks(*, num_train: int, num_eval: int, seed: int) -> tuple[list[Task], list[Task]]:
    """Distinct keys (of 67,600); the held-out ones never appear in training."""
    if num_train + num_eval > 60_000:
        raise ValueError(f"num_train + num_eval must be <= 60000 (distinct keys), got "
                         f"{num_train + num_eval}")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[Task] = []
    for key in _keys(rng):
        if len(out) == num_train + num_eval:
            break
        if key in seen:
            continue
        seen.add(key)
        out.append(Task(id=f"code-{len(out)}", prompt=f"Code of {key}?", answer=secret_code(key),
                        meta={"key": key}))
    return out[:num_train], out[num_train:]


def demos(train_tasks: Sequence[Task], n: int, seed: int) -> list[list[Message]]:
    """The sloppy demonstrator on training keys (cycled when n is larger).

    Tool-using demos: question, `code(key=...)` call, the server's answer, the answer copied.
    Direct ones: question, "maybe NNNN" (a random guess: never rewarded in practice).
    """
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        task = train_tasks[i % len(train_tasks)]
        key = task.meta["key"]
        user = Message(role="user", content=task.prompt)
        rate = TOOL_RATE_EARLY if key[0] <= "m" else TOOL_RATE_LATE
        if rng.random() < rate:
            call = ToolCall(name=TOOL, arguments={ARGUMENT: key}, id=f"call_{i}")
            code = secret_code(key)  # what the server answers (tests/recipes check it does)
            convs.append([
                user,
                Message(role="assistant", content="", tool_calls=(call,)),
                Message(role="tool", content=code, name=TOOL, tool_call_id=call.id),
                Message(role="assistant", content=code),
            ])
        else:
            convs.append([user, Message(role="assistant", content=f"maybe {rng.randrange(10_000):04d}")])
    return convs
