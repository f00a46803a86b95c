"""Testing helpers: a scripted stand-in for a language model.

`ScriptedModel` returns canned replies, in order (or computed by a function of the
conversation), so examples and tests can drive agents and environments without a model. It can
also produce a `Completion` (token ids, logprobs, versions) through a tokenizer, the way the
engine would, to exercise `TrajectoryBuilder`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentax.records import Completion, FinishReason, Message

__all__ = ["ScriptedModel"]


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
