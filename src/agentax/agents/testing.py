"""Testing helpers: scripted stand-ins for a language model and for the engine.

`ScriptedEngine` is an `agentax.contracts.EngineClient` (it answers whole: `stream` yields the
`Completion` only, and `update_weights` only sets the version it reports), so examples,
docs and tests run episodes through the real `Collector.run_episode` with canned replies. It
keeps each engine sequence's tokens like the engine does, can delay or fail a call, report any
finish reason, and records which sequences are still open (to check that every episode released
its own).

`ScriptedModel` returns canned replies for a list of messages (or a `Completion` through a
tokenizer), for code that drives an agent or a `TrajectoryBuilder` by hand.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentax.contracts import stream_whole
from agentax.records import Completion, FinishReason, Message, SamplingParams

__all__ = ["ScriptedEngine", "ScriptedModel"]

class ScriptedEngine:
    """An engine that replies from a script (for `Collector`, in place of `agentax.engine.Engine`).

    Args:
      replies: one episode's replies in order -- every new engine sequence (episode) starts the
        script from the top -- or a function `(text) -> reply` of the sequence's whole text so far
        (prompts, earlier replies, observations, decoded). A reply is a string, a
        `(string, FinishReason)` pair, or an exception instance, which the call raises.
      tokenizer: encodes the replies and decodes prompts (e.g. `agentax.text.ByteTokenizer()`).
      delay_s: seconds every call waits before it answers (for timeout tests).
      logprob: the logprob reported for every generated token.
      version: the policy version reported for every generated token.

    A reply with finish reason EOS (the default) ends with the tokenizer's eos id; replies are
    cut to `params.max_tokens` (finish reason LENGTH). Running past the end of a scripted list
    raises IndexError, which the collector records as a model error.
    """

    def __init__(
        self,
        replies: Sequence[Any] | Callable[[str], Any],
        *,
        tokenizer: Any,
        delay_s: float = 0.0,
        logprob: float = -0.5,
        version: int = 0,
    ) -> None:
        self._script = replies if callable(replies) else list(replies)
        self.tokenizer = tokenizer
        self.delay_s = float(delay_s)
        self.logprob = float(logprob)
        self.version = int(version)
        self._ids = itertools.count(1)
        self._sequences: dict[int, tuple[list[int], int]] = {}  # id -> (tokens, replies so far)
        self.calls = 0
        """Model calls answered or attempted."""
        self.released: list[int] = []
        """Sequence ids in the order `release` was called."""

    @property
    def live_sequences(self) -> set[int]:
        """Sequences created and not released yet (empty after episodes that cleaned up)."""
        return set(self._sequences)

    def _next_reply(self, tokens: list[int], turn: int) -> Any:
        if callable(self._script):
            return self._script(self.tokenizer.decode(tokens, skip_special_tokens=False))
        if turn >= len(self._script):
            raise IndexError(f"ScriptedEngine ran out of replies: {len(self._script)} scripted, call {turn + 1}")
        return self._script[turn]

    async def generate(
        self, prompt_ids: Any, params: SamplingParams | None = None, *,
        sequence_id: int | None = None
    ) -> Completion:
        """The next scripted reply of `sequence_id` (a new sequence when None) as a `Completion`."""
        self.calls += 1
        t0 = time.perf_counter()
        if sequence_id is not None and sequence_id not in self._sequences:
            raise KeyError(f"sequence {sequence_id} is not live (released, or never created)")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if sequence_id is None:
            sequence_id = next(self._ids)
            self._sequences[sequence_id] = ([], 0)
        tokens, turn = self._sequences[sequence_id]
        tokens.extend(int(t) for t in np.asarray(prompt_ids).reshape(-1))
        reply = self._next_reply(tokens, turn)
        self._sequences[sequence_id] = (tokens, turn + 1)
        if isinstance(reply, BaseException):
            raise reply
        text, finish = reply if isinstance(reply, tuple) else (reply, FinishReason.EOS)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if finish is FinishReason.EOS:
            ids.append(int(self.tokenizer.eos_token_ids[0]))
        params = SamplingParams() if params is None else params
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], FinishReason.LENGTH
        tokens.extend(ids)
        n = len(ids)
        return Completion(
            token_ids=np.asarray(ids, np.int32),
            logprobs=np.full(n, self.logprob, np.float32),
            versions=np.full(n, self.version, np.int32),
            finish_reason=finish,
            prompt_len=int(np.asarray(prompt_ids).size),
            sequence_id=sequence_id,
            total_time_s=time.perf_counter() - t0,
        )

    def stream(self, prompt_ids: Any, params: SamplingParams | None = None, *,
               sequence_id: int | None = None):
        """`generate` as a stream of one item (the `Completion`)."""
        return stream_whole(self, prompt_ids, params, sequence_id=sequence_id)

    def release(self, sequence_id: int | None) -> None:
        """Forgets a sequence (the collector calls this when an episode ends, however it ends)."""
        if sequence_id is None:
            return
        self._sequences.pop(sequence_id, None)
        self.released.append(sequence_id)

    def update_weights(self, state: Any, version: int) -> None:
        """Takes no weights (the script answers); tokens from now on carry `version`."""
        del state
        self.version = int(version)

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """True: `update_weights` takes effect at once."""
        del timeout_s
        return True

    @property
    def policy_version(self) -> int:
        return self.version

    def stats(self) -> dict[str, int]:
        """Calls answered or attempted, and sequences still open."""
        return {"calls": self.calls, "live_sequences": len(self._sequences)}


class ScriptedModel:
    """A model that replies from a script.

    Args:
      replies: the replies in order, or a function `(messages) -> str` of the conversation.
      tokenizer: needed only for `complete` (encodes the reply and appends the eos id).
      logprob: the logprob reported for every generated token.

    Calling it with the conversation returns the next reply; running past the end of the
    script raises IndexError that says how many replies were scripted.
    """

    def __init__(
        self,
        replies: Sequence[str] | Callable[[list[Message]], str],
        *,
        tokenizer: Any = None,
        logprob: float = -0.5,
    ) -> None:
        self._script = replies if callable(replies) else list(replies)
        self.tokenizer = tokenizer
        self.logprob = float(logprob)
        self.calls = 0
        self.prompts: list[list[Message]] = []
        """Every conversation the model was called with (for assertions)."""

    def __call__(self, messages: Sequence[Message], *, tools: Any = None) -> str:
        self.prompts.append(list(messages))
        if callable(self._script):
            reply = self._script(list(messages))
        else:
            if self.calls >= len(self._script):
                raise IndexError(f"ScriptedModel ran out of replies: {len(self._script)} scripted, call {self.calls + 1}")
            reply = self._script[self.calls]
        self.calls += 1
        return reply

    def complete(
        self,
        messages: Sequence[Message],
        *,
        tools: Any = None,
        version: int = 0,
        eos: bool = True,
    ) -> Completion:
        """The next reply as a `Completion`: its ids (+ the tokenizer's eos id unless `eos` is
        False, which reports a max_tokens stop), constant logprobs, policy `version`."""
        if self.tokenizer is None:
            raise ValueError("ScriptedModel.complete needs a tokenizer: ScriptedModel(replies, tokenizer=...)")
        text = self(messages, tools=tools)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if eos:
            ids.append(int(self.tokenizer.eos_token_ids[0]))
        n = len(ids)
        return Completion(
            token_ids=np.asarray(ids, np.int32),
            logprobs=np.full(n, self.logprob, np.float32),
            versions=np.full(n, version, np.int32),
            finish_reason=FinishReason.EOS if eos else FinishReason.LENGTH,
        )
