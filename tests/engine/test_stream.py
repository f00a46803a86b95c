"""`Engine.stream`: tokens as they are sampled, the same as `generate`, and cancellation."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from agentax.engine import TokenChunk
from agentax.records import Completion, FinishReason, SamplingParams

from engine_helpers import CFG, run

PROMPT = [5, 9, 200, 13, 77, 4]


def test_stream_yields_the_tokens_of_generate_in_several_chunks(engine):
    params = SamplingParams(temperature=0.0, max_tokens=20)

    async def scenario():
        want = await engine.generate(PROMPT, params)
        items = [item async for item in engine.stream(PROMPT, params)]
        return want, items

    want, items = run(scenario())
    *chunks, final = items
    assert all(isinstance(c, TokenChunk) for c in chunks) and isinstance(final, Completion)
    # the prefill's first token alone, then one chunk per fused decode call
    steps = CFG.decode_steps_per_call
    assert len(chunks) > 1 and len(chunks[0].token_ids) == 1
    assert all(1 <= len(c.token_ids) <= steps for c in chunks)
    streamed = np.concatenate([c.token_ids for c in chunks])
    np.testing.assert_array_equal(streamed, want.token_ids)
    np.testing.assert_array_equal(streamed, final.token_ids)
    np.testing.assert_array_equal(np.concatenate([c.logprobs for c in chunks]), final.logprobs)
    np.testing.assert_array_equal(np.concatenate([c.versions for c in chunks]), final.versions)
    assert final.finish_reason == FinishReason.LENGTH and final.prompt_len == len(PROMPT)


def test_stream_continues_a_sequence_like_generate(engine):
    params = SamplingParams(temperature=0.0, max_tokens=6)

    async def scenario():
        first = await engine.generate(PROMPT, params)
        items = [i async for i in engine.stream([3, 4], params, sequence_id=first.sequence_id)]
        again = await engine.generate(PROMPT, params)
        want = await engine.generate([3, 4], params, sequence_id=again.sequence_id)
        return items[-1], want

    got, want = run(scenario())
    np.testing.assert_array_equal(got.token_ids, want.token_ids)


def test_closing_the_stream_cancels_the_request_and_frees_its_slot(engine):
    params = SamplingParams(temperature=0.0, max_tokens=80)

    async def scenario():
        async with contextlib.aclosing(engine.stream(PROMPT, params)) as chunks:
            async for first in chunks:
                break
        busy_after_close = None
        for _ in range(200):  # the cancel reaches the step thread on its next iteration
            await asyncio.sleep(0.01)
            busy_after_close = engine.stats().active_slots
            if busy_after_close == 0:
                break
        return first, busy_after_close, engine.stats()

    first, busy, stats = run(scenario())
    assert isinstance(first, TokenChunk)
    assert busy == 0 and stats.parked_slots == 0  # freed, and its sequence forgotten
    assert stats.failed >= 1 and stats.total_tokens < 80  # cancelled, not run to the end
