"""Helpers of the endpoint tests: the tiny model config, a recording proxy, a scripted engine."""

from __future__ import annotations

import asyncio

import numpy as np

from agentax.models import ModelConfig
from agentax.records import Completion, FinishReason

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                         num_kv_heads=1, head_dim=32)


class Recording:
    """Wraps an engine; remembers every (prompt ids, sequence id, completion) it served."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[tuple[np.ndarray, int | None, Completion]] = []

    async def generate(self, prompt_ids, params=None, *, sequence_id=None):
        c = await self.engine.generate(prompt_ids, params, sequence_id=sequence_id)
        self.calls.append((np.asarray(prompt_ids), sequence_id, c))
        return c

    def release(self, sequence_id):
        self.engine.release(sequence_id)


class ScriptedEngine:
    """Answers with scripted replies (encoded + eos), so tool calls come out on demand."""

    def __init__(self, tok, replies):
        self.tok, self.replies = tok, list(replies)
        self.calls: list[tuple[np.ndarray, int | None]] = []
        self.released: list[int] = []
        self._next = 0

    async def generate(self, prompt_ids, params=None, *, sequence_id=None):
        await asyncio.sleep(0)
        self.calls.append((np.asarray(prompt_ids), sequence_id))
        reply = self.replies.pop(0)
        ids = np.asarray(self.tok.encode(reply) + [self.tok.eos_token_ids[0]], np.int32)
        if sequence_id is None:
            self._next += 1
            sequence_id = self._next
        n = ids.shape[0]
        return Completion(token_ids=ids, logprobs=np.full(n, -0.25, np.float32),
                          versions=np.full(n, 3, np.int32), finish_reason=FinishReason.EOS,
                          prompt_len=len(prompt_ids), sequence_id=sequence_id)

    def release(self, sequence_id):
        self.released.append(sequence_id)
