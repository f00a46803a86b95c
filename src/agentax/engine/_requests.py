"""Host-side records of the engine's step thread: requests, sequences, errors, future resolution.

Callers only ever see the error types (re-exported by `agentax.engine`); `_Request` and
`_Sequence` are the step thread's bookkeeping for one call and one conversation.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from agentax.records import SamplingParams

__all__ = ["EngineClosed", "EngineError", "PromptTooLong", "SequenceError", "TokenChunk"]


class EngineError(RuntimeError):
    """The engine cannot serve requests (its step loop failed); the cause is chained."""


class EngineClosed(EngineError):
    """The engine was shut down; pending and new requests fail with this."""


class PromptTooLong(ValueError):
    """A prompt (with the sequence's history, on a continuation) does not fit in one slot."""


class SequenceError(ValueError):
    """A continuation names a sequence that is unknown (released, cancelled) or busy."""


@dataclasses.dataclass(frozen=True, eq=False)
class TokenChunk:
    """Tokens `Engine.stream` yields as the step thread samples them (before the `Completion`).

    A chunk holds what one engine call added to the completion: the first token after the
    prefill, then up to `EngineConfig.decode_steps_per_call` tokens per decode call. Chunks
    are never taken back: a stop string cuts only tokens that were not yet streamed, so the
    chunks concatenate to the final `Completion.token_ids`.
    """

    token_ids: np.ndarray
    """[k] int32 sampled ids, in order."""
    logprobs: np.ndarray
    """[k] float32 behaviour logprob of each id."""
    versions: np.ndarray
    """[k] int32 policy version of the weights that sampled each id."""


@dataclasses.dataclass(eq=False)
class _Sequence:
    """A conversation's token history and where its KV cache lives."""

    id: int
    tokens: list[int]
    """Every token of the conversation so far (prompts and generated), in order."""
    cached: int = 0
    """Leading tokens of `tokens` whose k/v sit in its `pages` (0 when it holds none)."""
    slot: int | None = None
    request: _Request | None = None
    """The request in flight on this sequence, if any."""
    release_when_done: bool = False
    last_used: int = 0
    pages: list[int] = dataclasses.field(default_factory=list)
    """Pages holding its K/V, in position order (empty when it holds no cache)."""
    keys: list[int] = dataclasses.field(default_factory=list)
    """Prefix-index keys of its leading pages that are indexed (its own or shared ones)."""


@dataclasses.dataclass(eq=False)
class _Request:
    ids: np.ndarray
    params: SamplingParams
    sequence_id: int | None
    loop: asyncio.AbstractEventLoop | None
    future: Any  # asyncio.Future, or a concurrent-style holder for generate_batch
    submit_time: float
    seq: _Sequence | None = None
    admit_time: float | None = None
    pending: list[int] = dataclasses.field(default_factory=list)
    """Tokens still to prefill (history not in the cache + the new ids)."""
    out_tokens: list[int] = dataclasses.field(default_factory=list)
    out_logprobs: list[float] = dataclasses.field(default_factory=list)
    out_versions: list[int] = dataclasses.field(default_factory=list)
    stop_set: frozenset[int] = frozenset()
    prompt_keys: list[int] | None = None
    """Prefix-index keys of the full pages of a fresh sequence's tokens (computed once)."""
    inflight: list[int] = dataclasses.field(default_factory=list)
    """Keys of pages this request's prefill will write, that identical prompts wait for."""
    prefill_start: int = 0
    """The sequence's cached length when this request's prefill started."""
    prefill_version: int | None = None
    """Oldest policy version among this request's prefill calls so far."""
    cached_prompt_tokens: int = 0
    """Prompt tokens served from shared pages (not prefilled)."""
    on_tokens: Callable[[TokenChunk], None] | None = None
    """Called on the caller's loop with each chunk of new tokens (`Engine.stream`)."""
    done: bool = False
    result: Any = None
    """What the scheduler resolved it with when no event loop waits (its own tests)."""
    error: BaseException | None = None


def _resolve(req: _Request, *, result: Any = None, exc: BaseException | None = None) -> None:
    """Resolves a request's future on its own event loop (from the step thread)."""
    fut = req.future

    def settle() -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    try:
        req.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's loop is closed; nobody is waiting
        pass


def _emit_tokens(req: _Request, start: int) -> None:
    """Hands `req.out_tokens[start:]` to its token sink on the caller's loop (from the step
    thread: `call_soon_threadsafe` never blocks it, and runs the sink before the later
    `_resolve` of the same request). Without a loop (the scheduler's own tests) it calls the
    sink here."""
    chunk = TokenChunk(token_ids=np.asarray(req.out_tokens[start:], np.int32),
                       logprobs=np.asarray(req.out_logprobs[start:], np.float32),
                       versions=np.asarray(req.out_versions[start:], np.int32))
    if req.loop is None:
        req.on_tokens(chunk)
        return
    try:
        req.loop.call_soon_threadsafe(req.on_tokens, chunk)
    except RuntimeError:  # the caller's loop is closed; nobody is listening
        pass
