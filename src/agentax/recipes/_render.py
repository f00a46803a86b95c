"""Fast rendering of many short demonstrations for the byte tokenizer's built-in template.

`agentax.text.render_conversation` renders each assistant turn through the jinja template
several times (to find its exact span); for thousands of tiny demonstrations that is seconds
of the demo's two-minute budget (20 s for 8160 demonstrations with a tool list). The byte
template renders each message on its own, after one tool-list header when tools are given, so
the token stream and assistant mask can be composed message by message. `render_examples` uses
this path only for the byte tokenizer (with a tool list, a leading system message is part of
the header: one header per distinct system text), and only after checking that it reproduces
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
    """`messages` rendered one by one after `header` (which, with tools, holds a leading
    system message: it is skipped here)."""
    if header and messages and messages[0].role == "system":
        messages = messages[1:]
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


def _system(conv: Sequence[Message]) -> str | None:
    return conv[0].content if conv and conv[0].role == "system" else None


def _header(tokenizer: ByteTokenizer, tools: Any, system: str | None = None) -> list[int]:
    """The template's tool-list block, with a leading system message (empty without tools)."""
    if not tools:
        return []
    messages = [{"role": "system", "content": system}] if system is not None else []
    return tokenizer.encode(tokenizer.chat_template.render(messages, tools=tools))


def _fast_headers(tokenizer: Any, convs: Sequence[Sequence[Any]],
                  tools: Any) -> dict[str | None, list[int]] | None:
    """The header ids of each leading system text (None: none) when the fast path reproduces
    `render_conversation`, else None."""
    if type(tokenizer) is not ByteTokenizer:
        return None
    if not all(isinstance(m, Message) for c in convs for m in c):
        return None
    headers = {sys: _header(tokenizer, tools, sys) for sys in {_system(c) for c in convs}}
    # Check one of each conversation shape (roles + call counts + system text) plus the first few.
    seen, sample = set(), []
    for i, c in enumerate(convs):
        shape = (_system(c), tuple((m.role, len(m.tool_calls)) for m in c))
        if shape not in seen or i < _CHECK:
            seen.add(shape)
            sample.append(c)
    for conv in sample:
        ref = render_conversation(tokenizer, list(conv), tools=tools)
        ids, mask = _fast(tokenizer, conv, headers[_system(conv)])
        if not (np.array_equal(ids, ref.token_ids) and np.array_equal(mask, ref.assistant_mask)):
            return None
    return headers


def render_examples(tokenizer: Any, convs: Sequence[Sequence[Any]], *, tools=None,
                    instructions: str | None = None) -> list:
    """SFT examples — `(token_ids, loss_mask)` pairs — for chat conversations, rendered as the
    model sees them in an episode: with the tool list (`tools`, OpenAI schemas, as the agent
    or harness sends them) and a system message.

    Identical to `agentax.train.sft_examples` (which uses `render_conversation`); much faster
    for the byte tokenizer's template (thousands of demonstrations).

    Args:
      tokenizer: the model's tokenizer (its chat template renders each conversation).
      convs: demonstrations, each a list of `Message`s (or message dicts).
      tools: the tool list every prompt of the episodes carries, e.g. an OpenAI Agents SDK
        agent's tools as its model sends them.
      instructions: a system message put first in every conversation, e.g. an Agents SDK
        agent's `instructions` (the SDK sends them as the first, system, message).

    Raises:
      ValueError: `instructions` given for a conversation that has its own system message.
    """
    if instructions is not None:
        convs = [_with_instructions(c, instructions) for c in convs]
    headers = _fast_headers(tokenizer, convs, tools)
    if headers is not None:
        return [_fast(tokenizer, c, headers[_system(c)]) for c in convs]
    out = []
    for conv in convs:
        r = render_conversation(tokenizer, list(conv), tools=tools)
        out.append((r.token_ids, r.assistant_mask))
    return out


def _with_instructions(conv: Sequence[Any], instructions: str) -> list[Any]:
    first = conv[0] if conv else None
    role = first.get("role") if isinstance(first, dict) else getattr(first, "role", None)
    if role == "system":
        raise ValueError("render_examples(instructions=...) prepends a system message, but a "
                         "conversation already starts with one: give one or the other")
    return [Message(role="system", content=instructions), *conv]
