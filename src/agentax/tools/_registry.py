"""`ToolRegistry`: the set of tools one environment offers, looked up by name.

`call` turns a parsed `ToolCall` into a `ToolResult`; an unknown name is reported to the model
(error "unknown_tool", with the valid names), never raised.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from agentax.records import ToolCall, ToolResult
from agentax.tools._tool import Tool

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """Tools by name. Registering two tools under one name is a user error."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> Tool:
        """Adds `tool`; raises ValueError if its name is taken. Returns the tool."""
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a Tool (build one with agentax.tools.tool), got {type(tool).__name__}")
        if tool.name in self._tools:
            raise ValueError(f"a tool named '{tool.name}' is already registered")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def schemas(self) -> list[dict]:
        """OpenAI-form schemas of every tool, in registration order (for chat templates)."""
        return [t.schema() for t in self._tools.values()]

    async def call(self, call: ToolCall) -> ToolResult:
        """Executes `call`; never raises (unknown tool -> ok=False, error="unknown_tool")."""
        tool = self._tools.get(call.name)
        if tool is None:
            close = difflib.get_close_matches(str(call.name), list(self._tools), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            return ToolResult(
                name=str(call.name),
                content=f"Error: unknown tool '{call.name}'.{hint} Available tools: {', '.join(self._tools) or '(none)'}",
                call_id=call.id,
                ok=False,
                error="unknown_tool",
            )
        return await tool.call(call.arguments, call_id=call.id)
