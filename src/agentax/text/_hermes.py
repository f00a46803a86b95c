"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number.

Whitespace inside the tags is free (Qwen writes newlines, the byte template none). The JSON is
decoded with `raw_decode` first, so a `</tool_call>` inside a string argument does not end the
call early; a call that cannot be decoded extends to the next closing tag and becomes an error.
"""

from __future__ import annotations

import json

from agentax.records import ToolCall, ToolCallError
from agentax.text._tool_calls import ParsedReply, call_from_object, register_tool_parser

__all__ = ["parse_hermes"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _one_call(text: str, start: int) -> tuple[ToolCall | ToolCallError, int]:
    """Parse the call whose opening tag ends at `start`; return it and the position after it."""
    next_close = text.find(CLOSE, start)
    next_open = text.find(OPEN, start)
    pos = _skip_ws(text, start)
    try:
        obj, end = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as e:
        obj, end, why = None, -1, f"broken JSON in tool call: {e.msg} at char {e.pos - pos}"
    except RecursionError:
        obj, end, why = None, -1, "broken JSON in tool call: nested too deeply"
    if end >= 0:
        after = _skip_ws(text, end)
        if text.startswith(CLOSE, after):
            raw = text[pos:end]
            return call_from_object(obj, raw, "arguments"), after + len(CLOSE)
        why = (
            "the reply ends after the JSON object"
            if after >= len(text)
            else f"unexpected text after the JSON object: {text[after:after + 20]!r}"
        )
    if next_close < 0 or (0 <= next_open < next_close):
        stop = next_open if next_open >= 0 else len(text)
        return ToolCallError(raw=text[start:stop].strip(), message=f"unclosed {OPEN} tag ({why})"), stop
    return ToolCallError(raw=text[start:next_close].strip(), message=why), next_close + len(CLOSE)


def parse_hermes(text: str) -> ParsedReply:
    """Split `text` into content, calls and errors (never raises)."""
    content: list[str] = []
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    pos = 0
    while True:
        open_at = text.find(OPEN, pos)
        stray = text.find(CLOSE, pos)
        if 0 <= stray and (open_at < 0 or stray < open_at):  # a closing tag with no opening tag
            content.append(text[pos:stray])
            errors.append(ToolCallError(raw=CLOSE, message=f"{CLOSE} without a matching {OPEN}"))
            pos = stray + len(CLOSE)
            continue
        if open_at < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:open_at])
        result, pos = _one_call(text, open_at + len(OPEN))
        (calls if isinstance(result, ToolCall) else errors).append(result)
    return ParsedReply(content="".join(content).strip(), tool_calls=tuple(calls), errors=tuple(errors))


register_tool_parser("hermes", parse_hermes)
register_tool_parser("qwen", parse_hermes)
