"""Packed prefill (several fresh prompts per row) against the full-sequence forward pass."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentax.models import ModelConfig, Transformer, init_cache


@pytest.mark.parametrize("sliding", [False, True])
def test_packed_prefill_matches_full_forward_and_writes_every_token(sliding):
    extra = (dict(sliding_window=4, layer_types=("sliding", "sliding"), post_norms=True)
             if sliding else {})
    cfg = ModelConfig.tiny(num_layers=2, **extra)
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=n).tolist() for n in (5, 9, 3, 12)]
    # Rows of 16: [5, 9] and [3, 12]; one padding token in row 1, two in row 0.
    r, p, t_max = 2, 16, 32
    tokens = np.zeros((r, p), np.int32)
    positions = np.full((r, p), t_max, np.int32)
    segments = np.zeros((r, p), np.int32)
    slots = np.zeros((r, p), np.int32)
    last = []
    for seg, (row, start, ids) in enumerate([(0, 0, prompts[0]), (0, 5, prompts[1]),
                                             (1, 0, prompts[2]), (1, 3, prompts[3])]):
        cols = slice(start, start + len(ids))
        tokens[row, cols], positions[row, cols] = ids, np.arange(len(ids))
        segments[row, cols], slots[row, cols] = seg + 1, seg
        last.append(row * p + start + len(ids) - 1)
    cache = init_cache(cfg, 4, t_max)
    logits, cache = model.forward_packed(
        jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segments),
        jnp.asarray(slots), cache, jnp.asarray(last, jnp.int32),
    )
    for s, ids in enumerate(prompts):
        full = model(jnp.asarray([ids]))[0, -1]
        np.testing.assert_allclose(logits[s], full, rtol=2e-4, atol=2e-4)
        # The cache holds what a per-slot prefill writes: same K/V, nothing past the prompt.
        ref = init_cache(cfg, 1, t_max)
        _, ref = model.forward_cached(jnp.asarray([ids]), jnp.arange(len(ids))[None], ref)
        for got, want in zip(cache.k + cache.v, ref.k + ref.v):
            np.testing.assert_allclose(got[s], want[0], rtol=2e-5, atol=2e-5)
