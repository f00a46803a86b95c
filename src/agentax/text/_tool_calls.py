"""Tool-call parsing and formatting: the registry, `ParsedReply`, and `format_tool_call`.

A parser turns a model reply into text + well-formed `ToolCall`s + `ToolCallError`s. It never
raises into its caller: whatever the model wrote, a malformed call becomes an error value whose
message says what was wrong (the agent turns it into an observation and the model can retry).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from agentax.records import ToolCall, ToolCallError

__all__ = [
    "ParsedReply",
    "ToolParser",
    "format_tool_call",
    "get_tool_parser",
    "parse_tool_calls",
    "register_tool_parser",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParsedReply:
    """A model reply split into plain text, well-formed calls and malformed calls."""

    content: str
    """The reply text outside tool calls (stripped)."""
    tool_calls: tuple[ToolCall, ...] = ()
    errors: tuple[ToolCallError, ...] = ()


ToolParser = Callable[[str], ParsedReply]
_PARSERS: dict[str, ToolParser] = {}


def register_tool_parser(name: str, parser: ToolParser) -> None:
    """Make `parser` available as `get_tool_parser(name)` (and in configs by that name)."""
    if name in _PARSERS and _PARSERS[name] is not parser:
        raise ValueError(f"a tool parser named {name!r} is already registered")
    _PARSERS[name] = parser


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered under `name` ("hermes", "llama3", ...)."""
    try:
        return _PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; known: {sorted(_PARSERS)}") from None


def parse_tool_calls(text: str, fmt: str = "hermes") -> ParsedReply:
    """Parse `text` with the parser registered as `fmt`. Never raises on any text."""
    parser = get_tool_parser(fmt)
    if not isinstance(text, str):
        return ParsedReply(content="", errors=(ToolCallError(raw=repr(text), message="reply is not text"),))
    try:
        return parser(text)
    except Exception as e:  # a parser bug must not take down a rollout
        return ParsedReply(content=text, errors=(ToolCallError(raw=text, message=f"parser failed: {e!r}"),))


def call_from_object(obj: Any, raw: str, args_key: str) -> ToolCall | ToolCallError:
    """Validate a decoded JSON call `{"name": str, args_key: object}` (shared by the parsers)."""
    if not isinstance(obj, dict):
        return ToolCallError(raw=raw, message=f"tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError(raw=raw, message='tool call has no "name" (a non-empty string)')
    keys = [k for k in (args_key, "arguments", "parameters") if k in obj]
    args = obj[keys[0]] if keys else {}
    if isinstance(args, str):  # some models emit the arguments as a JSON-encoded string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return ToolCallError(raw=raw, message=f'"{keys[0]}" of {name!r} is a string, not a JSON object')
    if not isinstance(args, dict):
        key = keys[0] if keys else args_key
        return ToolCallError(raw=raw, message=f'"{key}" of {name!r} must be a JSON object, got {type(args).__name__}')
    return ToolCall(name=name, arguments=args)


def format_tool_call(call: ToolCall | Mapping[str, Any], fmt: str = "hermes", *, compact: bool = False) -> str:
    """The text a model writes to make `call`, for demonstrations and tests.

    Args:
      call: a `ToolCall`, or a dict with "name" and "arguments" (or OpenAI {"function": {...}}).
      fmt: "hermes" (Qwen: `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`) or
        "llama3" (`{"name": ..., "parameters": ...}`).
      compact: hermes without newlines and with tight JSON separators (the byte template's form).
    """
    if isinstance(call, Mapping):
        fn = call.get("function", call)
        call = ToolCall(name=fn["name"], arguments=fn.get("arguments", {}))
    args = dict(call.arguments)
    if fmt == "hermes":
        if compact:
            body = json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False, separators=(",", ":"))
            return f"<tool_call>{body}</tool_call>"
        body = json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"
    if fmt == "llama3":
        return json.dumps({"name": call.name, "parameters": args}, ensure_ascii=False)
    raise ValueError(f"format_tool_call knows 'hermes' and 'llama3', got {fmt!r}")
