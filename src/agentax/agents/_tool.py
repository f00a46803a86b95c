"""`ToolAgent`: offers tools through the chat template and parses tool calls from replies.

The tool schemas go to the template (`agent.tools`), which lists them in the system prompt in
the model family's own format. Replies are parsed with `agentax.text.parse_tool_calls` (Hermes
`<tool_call>` JSON for Qwen-style models, `llama3` JSON for Llama 3). A reply with no call and
no parse error is the final answer. Malformed calls are kept in `Action.parse_errors` and calls
to tools the agent does not offer are counted; the environment answers both with error
observations, so the model sees what went wrong and can retry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from agentax.agents._base import Agent
from agentax.records import Action, Message
from agentax.text import get_tool_parser, parse_tool_calls
from agentax.tools import mcp_tools_sync

__all__ = ["ToolAgent", "tool_schemas"]


def tool_schemas(tools: Any) -> list[dict[str, Any]]:
    """OpenAI function schemas from a ToolRegistry, Tools, or schema dicts (in order)."""
    if tools is None:
        return []
    if hasattr(tools, "schemas") and callable(tools.schemas):
        return [dict(s) for s in tools.schemas()]
    out: list[dict[str, Any]] = []
    for t in tools if isinstance(tools, Iterable) else [tools]:
        if isinstance(t, Mapping):
            schema = dict(t)
            if "function" not in schema and "name" in schema:
                schema = {"type": "function", "function": schema}
        elif hasattr(t, "schema") and callable(t.schema):
            schema = dict(t.schema())
        else:
            raise TypeError(f"cannot read a tool schema from {t!r}; give Tools, a ToolRegistry or schema dicts")
        if not isinstance(schema.get("function"), Mapping) or "name" not in schema["function"]:
            raise ValueError(f"tool schema lacks function.name: {schema!r}")
        out.append(schema)
    return out


class ToolAgent(Agent):
    """Agent that calls tools.

    Args:
      tools: a `ToolRegistry`, a list of `Tool`s, or OpenAI function schema dicts.
      mcp_servers: MCP servers whose tools are offered too, after `tools` (the same list as
        the environment's `mcp_servers`; see `agentax.tools.mcp_tools_sync`: a server is
        listed once per process, its schemas as it gives them).
      tool_format: parser name for `agentax.text.parse_tool_calls` ("hermes" or "llama3").
      system_prompt: system message (the template adds the tool list to it).
    """

    system_prompt = (
        "You are a helpful assistant. Use the tools when they help; when you know the answer, "
        "reply with the answer alone and no tool call."
    )

    def __init__(self, tools: Any = None, *, mcp_servers: Any = None, tool_format: str = "hermes",
                 system_prompt: str | None = None) -> None:
        super().__init__(system_prompt=system_prompt)
        self._schemas = tool_schemas(tools)
        if mcp_servers:
            self._schemas += [t.schema() for t in mcp_tools_sync(mcp_servers)]
        if not self._schemas:
            raise ValueError("ToolAgent needs at least one tool; use ModelAgent for plain chat")
        self.tool_names = frozenset(s["function"]["name"] for s in self._schemas)
        self.tool_format = tool_format
        get_tool_parser(tool_format)  # fail now, with the text team's message, on a bad name
        self._calls_made = 0
        self._last_content = ""

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [dict(s) for s in self._schemas]

    def parse_reply(self, reply: str) -> Action:
        parsed = parse_tool_calls(reply, fmt=self.tool_format)
        self._last_content = parsed.content
        calls = []
        for call in parsed.tool_calls:
            self._calls_made += 1
            if not call.id:
                call = dataclasses.replace(call, id=f"call_{self._calls_made}")
            if call.name not in self.tool_names:
                self._count("unknown_tools")
            calls.append(call)
        self._count("tool_calls", len(calls))
        final = parsed.content.strip() if not calls and not parsed.errors else None
        return Action(text=reply, tool_calls=tuple(calls), parse_errors=tuple(parsed.errors), final_answer=final)

    def assistant_message(self, reply: str, action: Action) -> Message:
        if not action.tool_calls and not action.parse_errors:
            return Message(role="assistant", content=reply)
        # Keep the text around the calls as content and the parsed calls as structure; a
        # malformed call stays visible as raw text so the conversation shows what was sent.
        content = self._last_content
        for err in action.parse_errors:
            if err.raw and err.raw not in content:
                content = f"{content}{err.raw}"
        return Message(role="assistant", content=content, tool_calls=tuple(action.tool_calls))

    def reset(self, task: Any) -> list[Message]:
        self._calls_made = 0
        return super().reset(task)

