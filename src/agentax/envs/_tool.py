"""`ToolEnvironment`: runs the agent's tool calls and scores its final answer.

Each step either executes tool calls — all calls of one reply concurrently, each bounded by
its tool's timeout — and returns their outputs as the next observation (`tool_results`), or,
when the reply has no tool call, scores it as the final answer with a reward function and ends
the episode. Nothing the model writes can crash it: malformed calls, unknown tools, bad
arguments, tools that raise or hang, and enormous outputs all come back as error results the
model can read, and are counted in `StepResult.info` and in `tool_stats`.

Subclasses can build tools per episode (`_make_tools`, e.g. a fresh sandbox) and score with
episode state (`_score`); `CodeEnvironment` and `SWEEnvironment` do both.

`mcp_servers` adds the tools of MCP servers (`agentax.tools.mcp_tools`): listed at each reset
through the worker's shared connection to each server (started on first use, restarted when
it dies), after any server's `reset_tool` has run; a server with `per_episode: true` gets a
session of this environment's own, closed with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentax._aio import bounded
from agentax.envs._base import Environment
from agentax.envs._reward import RewardFn, check_reward_fn, traced_reward
from agentax.records import Action, Observation, StepResult, Task, ToolCall, ToolResult
from agentax.tools import (
    MCPConnection,
    Tool,
    ToolRegistry,
    mcp_connection,
    mcp_server_specs,
    mcp_tools,
    truncate_output,
)
from agentax.trace import get_tracer, names

__all__ = ["ToolEnvironment"]

_COUNTERS = ("tool_calls", "tool_errors", "unknown_tools", "parse_errors", "tool_timeouts", "dropped_calls")


def as_registry(tools: ToolRegistry | Sequence[Tool] | None) -> ToolRegistry:
    if tools is None:
        return ToolRegistry()
    if isinstance(tools, ToolRegistry):
        return tools
    return ToolRegistry(tools)


class ToolEnvironment(Environment):
    """Multi-turn tool use: tool calls in, tool results out, reward on the final answer.

    Args:
      tools: a `ToolRegistry` or a list of `Tool`s (None when `_make_tools` builds them).
      reward_fn: `(task, final_answer) -> float`, sync or async, or a reward name.
      max_steps: model turns per episode (tool turns + the answer); default 10.
      max_calls_per_turn: calls beyond this in one reply are not run (an error result says so).
      max_output_chars: each tool output is cut to this many characters (head and tail kept).
      call_grace_s: extra seconds over a tool's own `timeout_s` before the environment gives up
        on a call that ignores its timeout.
      prompt_fn: builds the first user message from the task; default `task.prompt`.
      reward_timeout_s: limit of one reward call.
      mcp_servers: MCP servers whose tools are offered next to `tools`, as mappings
        (`[{command: python, args: [-m, my_server]}]` for stdio, `[{url: http://...}]` for
        streamable HTTP; every field in `agentax.tools.MCPServerSpec`). A bad entry is a
        ValueError naming the field (`mcp_servers[0].args must be a list of strings`).
      **limits: `reset_timeout_s`, `step_timeout_s` (see `Environment`).
    """

    max_steps = 10
    step_timeout_s = 300.0

    def __init__(
        self,
        tools: ToolRegistry | Sequence[Tool] | None = None,
        reward_fn: RewardFn | str | None = None,
        *,
        max_calls_per_turn: int = 8,
        max_output_chars: int = 8000,
        call_grace_s: float = 5.0,
        prompt_fn: Callable[[Task], str] | None = None,
        reward_timeout_s: float | None = 60.0,
        mcp_servers: Sequence[Any] | None = None,
        **limits: Any,
    ) -> None:
        super().__init__(**limits)
        if max_calls_per_turn < 1:
            raise ValueError(f"max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        self.registry = as_registry(tools)
        self.mcp_servers = mcp_server_specs(mcp_servers)
        """The MCP servers whose tools this environment offers (checked specs)."""
        self._native_registry = self.registry
        self._own_mcp: dict[str, MCPConnection] = {}
        self.reward_fn = None if reward_fn is None else check_reward_fn(reward_fn)
        self.max_calls_per_turn = max_calls_per_turn
        self.max_output_chars = max_output_chars
        self.call_grace_s = call_grace_s
        self.prompt_fn = prompt_fn
        self.reward_timeout_s = reward_timeout_s
        self.tool_stats: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        """Counters over this environment's lifetime (same keys as each step's info)."""

    # ------------------------------------------------------------------ hooks

    async def _make_tools(self, task: Task) -> ToolRegistry | None:
        """Tools for this episode; None keeps `self.registry`. Override for per-episode tools."""
        return None

    async def _score(self, task: Task, answer: str) -> float:
        """Reward of the final answer; default `reward_fn(task, answer)`."""
        if self.reward_fn is None:
            raise ValueError(f"{type(self).__name__} needs a reward_fn (or override _score)")
        return await traced_reward(self.reward_fn, task, answer, timeout_s=self.reward_timeout_s)

    # ------------------------------------------------------------------ episode

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Schemas of the current tools (give them to the agent / chat template)."""
        return self.registry.schemas()

    async def _reset(self, task: Task) -> Observation:
        made = await self._make_tools(task)
        if made is not None:
            self.registry = made
        if self.mcp_servers:
            await self._add_mcp_tools(made)
        prompt = self.prompt_fn(task) if self.prompt_fn is not None else task.prompt
        return Observation(content=prompt, info={"tools": list(self.registry.names)})

    async def _add_mcp_tools(self, made: ToolRegistry | None) -> None:
        """Runs each MCP server's reset hook and offers its tools after this episode's own."""
        base = made if made is not None else self._native_registry
        for spec in self.mcp_servers:
            if spec.per_episode and spec.key not in self._own_mcp:
                self._own_mcp[spec.key] = MCPConnection(spec)
            conn = self._own_mcp.get(spec.key) or mcp_connection(spec)
            await conn.reset(spec)
        listed = await mcp_tools(self.mcp_servers, connections=self._own_mcp)
        self.registry = ToolRegistry([*(base.get(n) for n in base.names), *listed])

    async def _close(self) -> None:
        own, self._own_mcp = self._own_mcp, {}
        for conn in own.values():
            await conn.close()

    async def _step(self, action: Action) -> StepResult:
        if not action.tool_calls and not action.parse_errors:
            task = self.task
            assert task is not None
            answer = action.final_answer if action.final_answer is not None else action.text
            reward = await self._score(task, answer)
            return StepResult(observation=Observation(), reward=reward, done=True, info={"final_answer": True})

        counts = dict.fromkeys(_COUNTERS, 0)
        calls = list(action.tool_calls[: self.max_calls_per_turn])
        dropped = list(action.tool_calls[self.max_calls_per_turn :])
        results = list(await asyncio.gather(*(self._run_call(c, counts) for c in calls)))
        for c in dropped:
            counts["dropped_calls"] += 1
            results.append(
                ToolResult(
                    name=c.name,
                    call_id=c.id,
                    ok=False,
                    error="too_many_calls",
                    content=f"Error: at most {self.max_calls_per_turn} tool calls per turn; this call was not run.",
                )
            )
        for err in action.parse_errors:
            counts["parse_errors"] += 1
            results.append(
                ToolResult(
                    name="",
                    ok=False,
                    error="parse_error",
                    content=f"Error: your tool call could not be parsed: {err.message}. Raw call: "
                    f"{truncate_output(err.raw, 500)}",
                )
            )
        counts["tool_errors"] = sum(1 for r in results if not r.ok)
        for k, v in counts.items():
            self.tool_stats[k] += v
        return StepResult(observation=Observation(role="tool", tool_results=tuple(results)), info=counts)

    async def _run_call(self, call: ToolCall, counts: dict[str, int]) -> ToolResult:
        counts["tool_calls"] += 1
        tool = self.registry.get(call.name)
        if tool is None:
            counts["unknown_tools"] += 1
        limit = (tool.timeout_s if tool is not None else 10.0) + self.call_grace_s
        t0 = time.perf_counter()
        with get_tracer().span(names.TOOL_CALL, args={"tool": str(call.name)}) as span:
            try:
                # bounded: a tool that swallows its cancellation is abandoned, not awaited.
                result = await bounded(self.registry.call(call), limit)
            except TimeoutError:
                result = ToolResult(
                    name=call.name, call_id=call.id, ok=False, error="timeout", content=f"Error: the tool gave no answer within {limit:.0f} s."
                )
            except Exception as e:  # noqa: BLE001 - tools must not raise, but a broken one must not kill the episode
                result = ToolResult(
                    name=call.name, call_id=call.id, ok=False, error="crashed", content=f"Error: the tool failed: {type(e).__name__}: {e}"
                )
            if not isinstance(result, ToolResult):
                result = ToolResult(
                    name=call.name, call_id=call.id, ok=False, error="crashed",
                    content=f"Error: the tool returned {type(result).__name__} instead of a result.",
                )  # fmt: skip
            span.set_arg(names.ARG_OK, bool(result.ok))
            if not result.ok:
                span.set_arg(names.ARG_ERROR, str(result.error or "error"))
        if result.error == "timeout":
            counts["tool_timeouts"] += 1
        if len(result.content) > self.max_output_chars:
            result = dataclasses.replace(result, content=truncate_output(result.content, self.max_output_chars))
        if not result.elapsed_s:
            result = dataclasses.replace(result, elapsed_s=time.perf_counter() - t0)
        return result
