"""Token-exact multi-turn rendering: prompt ids, continuation ids and assistant masks.

In a rollout the model's generated ids are never re-tokenized: the next prompt is the old
stream plus the *suffix* the template puts after the assistant's end-of-turn token (the
role header of the tool/user reply, its text, and the next generation prompt). These helpers
compute that suffix by rendering the template twice and cutting at the end of the last
assistant turn, and build whole conversations the same way, segment by segment, so that the
training stream is exactly what the model saw and produced.

The cut is the end of the last end-of-turn token (any of `tokenizer.eos_token_ids`) in the
rendered history. When a template rewrites earlier turns (Qwen3 drops the reasoning of
earlier assistant turns), the boundary is found by counting end-of-turn tokens instead, and
`is_prefix_stable` / `RenderedConversation.prefix_stable` report it. See docs/text.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agentax.records import Message
from agentax.text._protocol import Tokenizer

__all__ = [
    "RenderedConversation",
    "is_prefix_stable",
    "render_continuation",
    "render_conversation",
    "render_prompt",
]

MessageLike = Mapping[str, Any] | Message  # or a pydantic message object (e.g. the OpenAI SDK's)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RenderedConversation:
    """A conversation as one token stream, with 1 on the tokens the model generates."""

    token_ids: np.ndarray
    """[T] int32 ids, tokenized segment by segment (as a rollout would produce them)."""
    assistant_mask: np.ndarray
    """[T] int8: 1 on assistant content, tool-call text and end-of-turn token; 0 elsewhere."""
    text: str
    """The concatenated text of all segments."""
    segments: tuple[tuple[str, bool], ...]
    """(text, generated) pieces in order."""
    prefix_stable: bool
    """True when `text` equals a single render of the whole conversation (no turn rewritten)."""
    tokens_match: bool
    """True when `token_ids` equals tokenizing that single render in one go."""


def _role(message: MessageLike) -> str:
    if isinstance(message, Mapping):
        return str(message.get("role", ""))
    return str(getattr(message, "role", ""))  # a Message, or a pydantic message object


def _eos_pattern(tokenizer: Tokenizer) -> re.Pattern:
    strings = {tokenizer.decode([i]) for i in tokenizer.eos_token_ids}
    strings = sorted((s for s in strings if s), key=len, reverse=True)
    if not strings:
        raise ValueError("the tokenizer's eos_token_ids decode to empty strings; cannot find turn ends")
    return re.compile("|".join(re.escape(s) for s in strings))


def _render(tokenizer: Tokenizer, messages, tools, add_generation_prompt: bool, extra) -> str:
    return tokenizer.chat_template.render(
        list(messages), tools=tools, add_generation_prompt=add_generation_prompt, **extra
    )


def _continuation(tokenizer, history, new_messages, tools, add_generation_prompt, assistant_ended, extra):
    """(suffix text, prefix_stable, text of history+new) after the last assistant turn of history."""
    if not history or _role(history[-1]) != "assistant":
        raise ValueError("the history must end with an assistant message (the turn the model just generated)")
    eos_re = _eos_pattern(tokenizer)
    base = _render(tokenizer, history, tools, False, extra)
    nxt = _render(tokenizer, list(history) + list(new_messages), tools, add_generation_prompt, extra)
    base_ends = list(eos_re.finditer(base))
    if not base_ends:  # a template without end-of-turn tokens: the whole history was generated
        cut, stable = len(base), nxt.startswith(base)
        if not stable:
            raise ValueError("the chat template renders no end-of-turn token and rewrites earlier turns")
        return nxt[cut:], True, nxt
    last = base_ends[-1]
    cut = last.end() if assistant_ended else last.start()
    if nxt[:cut] == base[:cut]:
        return nxt[cut:], True, nxt
    # The template rewrote earlier text: the same turn ends at the same-numbered end-of-turn token.
    nxt_ends = list(eos_re.finditer(nxt))
    if len(nxt_ends) < len(base_ends):
        raise ValueError(
            "the chat template drops end-of-turn tokens of earlier turns; cannot find where the "
            "last assistant turn ends in the continued conversation"
        )
    match = nxt_ends[len(base_ends) - 1]
    return nxt[match.end() if assistant_ended else match.start() :], False, nxt


def render_prompt(
    tokenizer: Tokenizer,
    messages: Sequence[MessageLike],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> np.ndarray:
    """[P] int32 ids of the first prompt: the rendered messages plus the generation prompt."""
    text = _render(tokenizer, messages, tools, True, template_kwargs)
    return np.asarray(tokenizer.encode(text), dtype=np.int32)


def render_continuation(
    tokenizer: Tokenizer,
    history: Sequence[MessageLike],
    new_messages: Sequence[MessageLike],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    assistant_ended: bool = True,
    **template_kwargs: Any,
) -> np.ndarray:
    """Ids to append after the assistant's generated ids to continue the conversation.

    Args:
      tokenizer: the model's tokenizer.
      history: the messages so far, ending with the assistant turn just generated.
      new_messages: the tool results / user messages that answer it.
      tools: the tool schemas the conversation was rendered with.
      add_generation_prompt: end with the header of the next assistant turn.
      assistant_ended: True when the generated ids end with the end-of-turn token (the
        completion stopped on eos). False (e.g. cut by max_tokens) makes the suffix start
        with the end-of-turn token, so the stream stays well-formed.
      **template_kwargs: further template variables (enable_thinking, date_string...).

    Returns:
      [S] int32 ids: what the template puts after the end-of-turn token, up to the next prompt.
    """
    suffix, _, _ = _continuation(
        tokenizer, history, new_messages, tools, add_generation_prompt, assistant_ended, template_kwargs
    )
    return np.asarray(tokenizer.encode(suffix), dtype=np.int32)


def is_prefix_stable(
    tokenizer: Tokenizer,
    history: Sequence[MessageLike],
    new_messages: Sequence[MessageLike],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> bool:
    """Whether rendering history + new_messages leaves the text of history unchanged.

    False means the template rewrites earlier turns (Qwen3 drops earlier reasoning): a fresh
    render of the conversation then differs from the token stream the model actually saw,
    and only the appended stream (`render_continuation`) is token-exact with the rollout.
    """
    _, stable, _ = _continuation(tokenizer, history, new_messages, tools, True, True, template_kwargs)
    return stable


def render_conversation(
    tokenizer: Tokenizer,
    messages: Sequence[MessageLike],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> RenderedConversation:
    """Render a whole conversation as the rollout would have built it, with an assistant mask.

    Segments: the first prompt (up to the first assistant generation prompt), then for each
    assistant turn its generated text (content, tool calls, end-of-turn token; mask 1) and
    the continuation after it (mask 0). Each segment is tokenized on its own.

    Returns:
      A `RenderedConversation`; its `prefix_stable` / `tokens_match` flags say whether the
      stream also equals a single render / a single tokenization of the whole conversation.
    """
    msgs = list(messages)
    extra = template_kwargs
    eos_re = _eos_pattern(tokenizer)
    assistant_at = [i for i, m in enumerate(msgs) if _role(m) == "assistant"]
    segments: list[tuple[str, bool]] = []
    stable = True
    if not assistant_at:
        segments.append((_render(tokenizer, msgs, tools, False, extra), False))
    else:
        prompt = _render(tokenizer, msgs[: assistant_at[0]], tools, True, extra)
        segments.append((prompt, False))
        prev = None
        for i in assistant_at:
            if prev is not None:
                suffix, ok, prompt = _continuation(
                    tokenizer, msgs[: prev + 1], msgs[prev + 1 : i], tools, True, True, extra
                )
                stable &= ok
                segments.append((suffix, False))
            full = _render(tokenizer, msgs[: i + 1], tools, False, extra)
            if full.startswith(prompt):
                start = len(prompt)
            else:  # the generation prompt is not how this turn starts once rendered
                start, stable = len(os.path.commonprefix((full, prompt))), False
            ends = list(eos_re.finditer(full, start))
            end = ends[-1].end() if ends else len(full)
            segments.append((full[start:end], True))
            prev = i
        tail, ok, _ = _continuation(tokenizer, msgs[: prev + 1], msgs[prev + 1 :], tools, False, True, extra)
        stable &= ok
        segments.append((tail, False))

    ids: list[int] = []
    mask: list[int] = []
    for text, generated in segments:
        piece = tokenizer.encode(text) if text else []
        ids += piece
        mask += [int(generated)] * len(piece)
    text = "".join(s for s, _ in segments)
    full_text = _render(tokenizer, msgs, tools, False, extra)
    return RenderedConversation(
        token_ids=np.asarray(ids, dtype=np.int32),
        assistant_mask=np.asarray(mask, dtype=np.int8),
        text=text,
        segments=tuple(segments),
        prefix_stable=stable and text == full_text,
        tokens_match=ids == tokenizer.encode(full_text),
    )
