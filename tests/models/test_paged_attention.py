"""The ragged paged attention (`paged_forward`, `paged_decode_step`) gives the dense cache
path's numbers on random row lengths, page orders, sliding windows and soft-caps, jitted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentax.models import (PAGE, KVCache, ModelConfig, Transformer, paged_decode_step,
                            paged_forward)

T_MAX = 192  # 12 pages a row
S = 5

CONFIGS = {
    "plain": ModelConfig.tiny(dtype="float32"),
    "window_softcap": ModelConfig.tiny(dtype="float32", sliding_window=24,
                                       layer_types=("sliding", "full", "sliding", "full"),
                                       attn_logit_softcap=20.0),
}


def _model(name):
    return Transformer(CONFIGS[name], rngs=nnx.Rngs(3))


def _random_pool(cfg, rng):
    """A pool of random K/V pages, rows' pages in a random order, and the dense cache
    [S, K, T_MAX, H] holding the same values at each row's positions."""
    per_row = T_MAX // PAGE
    pages = S * per_row + 3  # a few pages nobody lists
    table = rng.permutation(pages)[:S * per_row].reshape(S, per_row).astype(np.int32)
    shape = (pages, cfg.num_kv_heads, PAGE, cfg.head_dim)
    pool_k = [rng.normal(size=shape).astype(np.float32) for _ in range(cfg.num_layers)]
    pool_v = [rng.normal(size=shape).astype(np.float32) for _ in range(cfg.num_layers)]

    def dense(p):  # [S, K, T, H]
        return p[table].transpose(0, 2, 1, 3, 4).reshape(S, cfg.num_kv_heads, T_MAX, -1)

    pool = KVCache(tuple(map(jnp.asarray, pool_k)), tuple(map(jnp.asarray, pool_v)))
    rows = KVCache(tuple(jnp.asarray(dense(p)) for p in pool_k),
                   tuple(jnp.asarray(dense(p)) for p in pool_v))
    return pool, rows, jnp.asarray(table)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ragged_decode_equals_dense_on_random_lengths(name):
    model = _model(name)
    cfg = model.config
    rng = np.random.default_rng(0)
    pool, rows, table = _random_pool(cfg, rng)
    start = jnp.asarray(rng.integers(1, T_MAX - 4, size=S).astype(np.int32))
    start = start.at[0].set(PAGE * 3)  # a row ending on a page boundary
    active = jnp.asarray([True, True, False, True, True])
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, size=S).astype(np.int32))
    steps = 2

    @jax.jit
    def both(tokens, pool, rows, table):
        fresh_p = rows.fresh(steps)
        fresh_d = rows.fresh(steps)
        outs = []
        for step in range(steps):  # the call's earlier steps come from `fresh`
            pos = start + step
            lp, fresh_p = paged_decode_step(model, tokens, pos, pool, table, fresh_p,
                                            jnp.int32(step), start, active)
            ld, fresh_d = model.decode_step(tokens, pos, rows, fresh_d, jnp.int32(step), start,
                                            T_MAX)
            outs.append((lp, ld))
            tokens = jnp.argmax(ld, -1).astype(jnp.int32)
        return outs

    for lp, ld in both(tokens, pool, rows, table):
        np.testing.assert_allclose(np.asarray(lp)[np.asarray(active)],
                                   np.asarray(ld)[np.asarray(active)], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_paged_prefill_equals_dense_and_writes_each_rows_pages(name):
    model = _model(name)
    cfg = model.config
    rng = np.random.default_rng(1)
    pool, rows, table = _random_pool(cfg, rng)
    chunk = 40
    first = np.array([0, 7, 100, 150, 0])  # where each row's chunk starts
    positions = first[:, None] + np.arange(chunk)[None, :]
    positions[4] = T_MAX  # a padding row: writes nothing
    positions[1, :5] = T_MAX  # right-aligned: padding before a row's tokens
    positions = jnp.asarray(np.minimum(positions, T_MAX).astype(np.int32))
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, size=(S, chunk)).astype(np.int32))
    slots = jnp.arange(S, dtype=jnp.int32)

    @jax.jit
    def both(pool, rows):
        lp, new_pool = paged_forward(model, tokens, positions, pool, table[slots], T_MAX,
                                     last_only=False)
        ld, new_rows = model.forward_cached(tokens, positions, rows, slot_ids_b=slots,
                                            attend_len=T_MAX)
        return lp, ld, new_pool, new_rows

    lp, ld, new_pool, new_rows = both(pool, rows)
    real = np.asarray(positions) < T_MAX
    np.testing.assert_allclose(np.asarray(lp)[real], np.asarray(ld)[real], rtol=2e-4, atol=2e-4)
    t = np.asarray(table)
    for got, want in zip(new_pool.k + new_pool.v, new_rows.k + new_rows.v):
        dense = np.asarray(got)[t].transpose(0, 2, 1, 3, 4).reshape(np.asarray(want).shape)
        np.testing.assert_allclose(dense, np.asarray(want), rtol=1e-5, atol=1e-5)
