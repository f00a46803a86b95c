"""Fast rendering of many short demonstrations for the byte tokenizer's built-in template.

`agentax.text.render_conversation` renders each assistant turn through the jinja template
several times (to find its exact span); for thousands of tiny demonstrations that is seconds
of the demo's two-minute budget (20 s for 8160 demonstrations with a tool list). The byte
template renders each message on its own, after one tool-list header when tools are given, so
the token stream and assistant mask can be composed message by message. `render_examples` uses
this path only for the byte tokenizer (with a tool list, only for conversations without a
system message, which the header would absorb), and only after checking that it reproduces
`render_conversation` id for id on a sample; otherwise it renders the slow way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentax.records import Message
from agentax.text import ByteTokenizer, render_conversation

__all__ = ["render_examples"]

_CHECK = 16


def _calls_text(msg: Message) -> str:
    out = []
    for call in msg.tool_calls:
        args = json.dumps(dict(call.arguments), separators=(",", ":"), sort_keys=True)
        out.append('<tool_call>{"name":' + json.dumps(call.name) + ',"arguments":' + args
                   + "}</tool_call>")
    return "".join(out)


def _fast(tokenizer: ByteTokenizer, messages: Sequence[Message],
          header: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    ids: list[int] = list(header)
    mask: list[int] = [0] * len(ids)

    def add(text: str, m: int) -> None:
        piece = tokenizer.encode(text)
        ids.extend(piece)
        mask.extend([m] * len(piece))

    for msg in messages:
        add(f"<|im_start|>{msg.role}\n", 0)
        if msg.role == "assistant":
            add(msg.content + _calls_text(msg) + "<|im_end|>", 1)
            add("\n", 0)
        elif msg.role == "tool":
            add(f"<tool_response>{msg.content}</tool_response><|im_end|>\n", 0)
        else:
            add(f"{msg.content}<|im_end|>\n", 0)
    return np.asarray(ids, np.int32), np.asarray(mask, np.int8)


def _header(tokenizer: ByteTokenizer, tools: Any) -> list[int]:
    """The template's tool-list block (empty without tools)."""
    return tokenizer.encode(tokenizer.chat_template.render([], tools=tools)) if tools else []


def _fast_header(tokenizer: Any, convs: Sequence[Sequence[Any]], tools: Any) -> list[int] | None:
    """The tool-list header ids when the fast path reproduces `render_conversation`, else None."""
    if type(tokenizer) is not ByteTokenizer:
        return None
    if not all(isinstance(m, Message) for c in convs for m in c):
        return None
    if tools and any(c and c[0].role == "system" for c in convs):
        return None
    header = _header(tokenizer, tools)
    # Check one of each conversation shape (roles + call counts) plus the first few.
    seen, sample = set(), []
    for i, c in enumerate(convs):
        shape = tuple((m.role, len(m.tool_calls)) for m in c)
        if shape not in seen or i < _CHECK:
            seen.add(shape)
            sample.append(c)
    for conv in sample:
        ref = render_conversation(tokenizer, list(conv), tools=tools)
        ids, mask = _fast(tokenizer, conv, header)
        if not (np.array_equal(ids, ref.token_ids) and np.array_equal(mask, ref.assistant_mask)):
            return None
    return header


def render_examples(tokenizer: Any, convs: Sequence[Sequence[Any]], *, tools=None) -> list:
    """SFT examples — `(token_ids, loss_mask)` pairs — for chat conversations.

    Identical to `agentax.train.sft_examples` (which uses `render_conversation`); faster for
    the byte tokenizer's template.
    """
    header = _fast_header(tokenizer, convs, tools)
    if header is not None:
        return [_fast(tokenizer, c, header) for c in convs]
    out = []
    for conv in convs:
        r = render_conversation(tokenizer, list(conv), tools=tools)
        out.append((r.token_ids, r.assistant_mask))
    return out
