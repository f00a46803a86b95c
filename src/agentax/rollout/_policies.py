"""`FunctionPolicy`: a fixed, programmatic player behind the collector's `GenerateFn` API.

A role of a multi-agent episode that should not learn (a baseline opponent, a rule-based
verifier) plays through the same collector loop as the trained roles, with the same limits and
timeouts; its "model" is a Python function of the conversation text.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agentax.records import Completion, FinishReason, SamplingParams

__all__ = ["FunctionPolicy"]


class FunctionPolicy:
    """A `GenerateFn` whose replies come from `fn(text) -> str` (sync or async).

    Args:
      fn: called with the whole conversation of the role so far as text (its prompts, earlier
        replies and observations, decoded with special tokens); returns the reply text.
      tokenizer: encodes replies and decodes prompts.

    Use it as `RolePolicy(engine=FunctionPolicy(fn, tokenizer), trained=False)`. Its tokens
    carry logprob 0 and version -1 (they are never trained on).
    """

    def __init__(self, fn: Callable[[str], Any], tokenizer: Any) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionPolicy needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.tokenizer = tokenizer
        self._ids = itertools.count(1)
        self._sequences: dict[int, list[int]] = {}
        self.calls = 0

    async def generate(self, prompt_ids: Any, params: SamplingParams, *,
                       sequence_id: int | None = None) -> Completion:
        """The function's reply to the sequence so far, as a `Completion`."""
        self.calls += 1
        t0 = time.perf_counter()
        if sequence_id is None:
            sequence_id = next(self._ids)
            self._sequences[sequence_id] = []
        elif sequence_id not in self._sequences:
            raise KeyError(f"sequence {sequence_id} is not live (released, or never created)")
        tokens = self._sequences[sequence_id]
        tokens.extend(int(t) for t in np.asarray(prompt_ids).reshape(-1))
        reply = self.fn(self.tokenizer.decode(tokens, skip_special_tokens=False))
        if inspect.isawaitable(reply):
            reply = await reply
        else:
            await asyncio.sleep(0)  # a turn of the loop, as a model call would give
        if not isinstance(reply, str):
            raise TypeError(f"FunctionPolicy's function returned {type(reply).__name__}; expected str")
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False),
               int(self.tokenizer.eos_token_ids[0])]
        finish = FinishReason.EOS
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], FinishReason.LENGTH
        tokens.extend(ids)
        n = len(ids)
        return Completion(token_ids=np.asarray(ids, np.int32), logprobs=np.zeros(n, np.float32),
                          versions=np.full(n, -1, np.int32), finish_reason=finish,
                          prompt_len=int(np.asarray(prompt_ids).size), sequence_id=sequence_id,
                          total_time_s=time.perf_counter() - t0)

    def release(self, sequence_id: int) -> None:
        """Forgets a sequence."""
        self._sequences.pop(sequence_id, None)
