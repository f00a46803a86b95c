"""Sliding-window layers held as rings: the sizes, and Gemma 3 through the engine against
`transformers` across many wraps of the ring."""

from __future__ import annotations

import asyncio

import jax.numpy as jnp
import numpy as np
import pytest
from models_helpers import VOCAB, hf_greedy, make_hf_model

from agentax.engine import Engine, EngineConfig
from agentax.models import ModelConfig, Transformer, init_cache, kv_cache_bytes, load_pretrained
from agentax.records import SamplingParams

GEMMA_LIKE = ModelConfig.tiny(num_layers=6, sliding_window=512,
                              layer_types=("sliding",) * 5 + ("full",))


def test_sliding_layers_hold_a_window_plus_one_call():
    cache = init_cache(GEMMA_LIKE, 2, 8192, max_tokens_per_call=128)
    assert [c.shape[2] for c in cache.k] == [639] * 5 + [8192]
    assert cache.max_seq_len == 8192
    assert kv_cache_bytes(GEMMA_LIKE, 2, 8192, max_tokens_per_call=128) == \
        sum(c.nbytes for c in cache.k + cache.v)
    # 5 of 6 layers hold 639 positions instead of 8192: 4.3x less KV memory
    assert kv_cache_bytes(GEMMA_LIKE, 2, 8192) / sum(c.nbytes for c in cache.k + cache.v) == \
        pytest.approx(6 * 8192 / (5 * 639 + 8192))
    # no ring without the call size, when the ring would not be shorter, or when no layer
    # holds the whole slot (its length is what positions are checked against)
    assert {c.shape[2] for c in init_cache(GEMMA_LIKE, 1, 8192).k} == {8192}
    assert {c.shape[2] for c in init_cache(GEMMA_LIKE, 1, 600, max_tokens_per_call=128).k} == {600}
    all_sliding = ModelConfig.tiny(num_layers=2, sliding_window=8, layer_types=("sliding",) * 2)
    assert {c.shape[2] for c in init_cache(all_sliding, 1, 64, max_tokens_per_call=4).k} == {64}


def test_a_call_longer_than_the_ring_was_sized_for_is_refused():
    config = ModelConfig.tiny(num_layers=2, sliding_window=8, layer_types=("sliding", "full"))
    model = Transformer(config)
    cache = init_cache(config, 1, 64, max_tokens_per_call=4)  # ring of 11
    tokens = jnp.zeros((1, 5), jnp.int32)
    positions = jnp.arange(5, dtype=jnp.int32)[None]
    with pytest.raises(ValueError, match="max_tokens_per_call=5"):
        model.forward_cached(tokens, positions, cache)
    model.forward_cached(tokens[:, :4], positions[:, :4], cache)  # 4 fit


@pytest.mark.parametrize("paged", [False, True], ids=["rings", "paged"])
def test_gemma3_engine_with_rings_matches_transformers(tmp_path, paged):
    hf = make_hf_model("gemma3")  # window 8 on layers 0 and 2
    hf.save_pretrained(tmp_path)
    model = load_pretrained(tmp_path)
    # Chunks of 8 and 4 fused decode steps: rings of 8 + 8 - 1 = 15 positions. Prompts of
    # up to 40 tokens (5 chunks) and 24 new tokens wrap them four times. Paged: every layer
    # in 16-token pages (the window masks), 160 positions for the 3 sequences.
    config = EngineConfig(max_slots=3, max_seq_len=80, prefill_chunk=8, min_prefill_bucket=8,
                          decode_steps_per_call=4, min_attend_bucket=16,
                          kv_cache_tokens=160 if paged else 0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, VOCAB, size=n).tolist() for n in (40, 9, 23)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    with Engine(model, config) as engine:
        rings = 2 * 3 * 1 * 32 * 4 * (15 + 80 + 15)  # K/V x slots x kv heads x head_dim x f32
        pages = 2 * 3 * 1 * 32 * 4 * 160  # K/V x layers x kv heads x head_dim x f32
        assert engine.kv_cache_bytes == (pages if paged else rings)
        assert engine.kv_cache_bytes < kv_cache_bytes(model.config, 3, 80)

        async def episode():
            outs = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
            # a continuation picks its parked rings up where the first turn left them
            more = SamplingParams(temperature=0.0, max_tokens=8)
            return outs, await engine.generate([5, 6, 7], more, sequence_id=outs[0].sequence_id)

        outs, turn2 = asyncio.run(episode())
        assert engine.stats().evictions == 0
    for prompt, out in zip(prompts, outs):
        assert out.token_ids.tolist() == hf_greedy(hf, np.asarray([prompt]), 24)[0].tolist()
    history = prompts[0] + outs[0].token_ids.tolist() + [5, 6, 7]
    assert turn2.token_ids.tolist() == hf_greedy(hf, np.asarray([history]), 8)[0].tolist()
