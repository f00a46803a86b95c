"""Llama 3 JSON tool calls: `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`,
several separated by `;`.

A reply is read as tool calls when it starts (after whitespace) with `<|python_tag|>` or with
a JSON object `{"...`; otherwise it is plain content. Text after the last call is content.
"""

from __future__ import annotations

import json

from agentax.records import ToolCall, ToolCallError
from agentax.text._tool_calls import ParsedReply, call_from_object, register_tool_parser

__all__ = ["parse_llama3"]

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_WS = " \t\r\n"


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def _looks_like_call(text: str, pos: int) -> bool:
    return text.startswith("{", pos) and text.startswith('"', _skip_ws(text, pos + 1))


def parse_llama3(text: str) -> ParsedReply:
    """Split `text` into content, calls and errors (never raises)."""
    pos = _skip_ws(text, 0)
    tagged = text.startswith(PYTHON_TAG, pos)
    if tagged:
        pos = _skip_ws(text, pos + len(PYTHON_TAG))
    elif not _looks_like_call(text, pos):
        return ParsedReply(content=text.strip())
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    while True:
        if not text.startswith("{", pos):
            rest = text[pos:].strip()
            errors.append(ToolCallError(raw=rest, message="expected a JSON object for the tool call"))
            return ParsedReply(content="", tool_calls=tuple(calls), errors=tuple(errors))
        try:
            obj, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raw = text[pos:].strip()
            message = f"broken JSON in tool call: {e.msg} at char {e.pos - pos}"
            errors.append(ToolCallError(raw=raw, message=message))
            return ParsedReply(content="", tool_calls=tuple(calls), errors=tuple(errors))
        except RecursionError:
            message = "broken JSON in tool call: nested too deeply"
            errors.append(ToolCallError(raw=text[pos:].strip(), message=message))
            return ParsedReply(content="", tool_calls=tuple(calls), errors=tuple(errors))
        result = call_from_object(obj, text[pos:end], "parameters")
        (calls if isinstance(result, ToolCall) else errors).append(result)
        pos = _skip_ws(text, end)
        if text.startswith(";", pos):
            pos = _skip_ws(text, pos + 1)
            if pos < len(text):
                continue
        return ParsedReply(content=text[pos:].strip(), tool_calls=tuple(calls), errors=tuple(errors))


register_tool_parser("llama3", parse_llama3)
register_tool_parser("llama3_json", parse_llama3)
