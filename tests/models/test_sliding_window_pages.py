"""Sliding-window layers over pages: Gemma 3 through the engine against `transformers`, with
prompts and generations several windows long and a continuation of a parked sequence."""

from __future__ import annotations

import asyncio

import numpy as np
from models_helpers import VOCAB, hf_greedy, make_hf_model

from agentax.engine import Engine, EngineConfig
from agentax.models import load_pretrained
from agentax.records import SamplingParams


def test_gemma3_engine_matches_transformers(tmp_path):
    hf = make_hf_model("gemma3")  # window 8 on layers 0 and 2
    hf.save_pretrained(tmp_path)
    model = load_pretrained(tmp_path)
    # Chunks of 8 and 4 fused decode steps; prompts of up to 40 tokens (5 chunks) and 24 new
    # tokens, 8 windows. Every layer in 16-token pages (the window masks and skips the pages
    # before it), 160 positions for the 3 sequences.
    config = EngineConfig(max_slots=3, max_seq_len=80, prefill_chunk=8, min_prefill_bucket=8,
                          decode_steps_per_call=4, kv_cache_tokens=160)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, VOCAB, size=n).tolist() for n in (40, 9, 23)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    with Engine(model, config) as engine:
        pages = 2 * 3 * 1 * 32 * 4 * 160  # K/V x layers x kv heads x head_dim x f32
        assert engine.kv_cache_bytes == pages

        async def episode():
            outs = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
            # a continuation picks its parked pages up where the first turn left them
            more = SamplingParams(temperature=0.0, max_tokens=8)
            return outs, await engine.generate([5, 6, 7], more, sequence_id=outs[0].sequence_id)

        outs, turn2 = asyncio.run(episode())
        assert engine.stats().evictions == 0
    for prompt, out in zip(prompts, outs):
        assert out.token_ids.tolist() == hf_greedy(hf, np.asarray([prompt]), 24)[0].tolist()
    history = prompts[0] + outs[0].token_ids.tolist() + [5, 6, 7]
    assert turn2.token_ids.tolist() == hf_greedy(hf, np.asarray([history]), 8)[0].tolist()
