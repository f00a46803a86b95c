"""The ragged paged attention (`paged_forward`, `paged_decode_step`) gives the full-sequence
forward's logits on random row lengths, page orders, sliding windows and soft-caps, jitted:
prompts prefilled in two chunks into pages listed in a random order, then fused decode
steps fed the next tokens (teacher forcing)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentax.models import (PAGE, KVCache, ModelConfig, Transformer, init_page_pool,
                            paged_decode_step, paged_forward)

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


def _setup(cfg, rng):
    """Token ids [S, T_MAX], a zeroed pool with a few pages nobody lists, and a table listing
    each row's pages in a random order."""
    per_row = T_MAX // PAGE
    pages = S * per_row + 3
    table = rng.permutation(pages)[:S * per_row].reshape(S, per_row).astype(np.int32)
    ids = rng.integers(0, cfg.vocab_size, size=(S, T_MAX)).astype(np.int32)
    return jnp.asarray(ids), init_page_pool(cfg, pages), jnp.asarray(table)


def _chunk_positions(lo, hi, width):
    """[S, width] positions lo[s]..hi[s]-1, left-aligned; T_MAX (writes nothing) after."""
    pos = lo[:, None] + np.arange(width)[None, :]
    return jnp.asarray(np.where(pos < hi[:, None], pos, T_MAX).astype(np.int32))


def _prefill(model, ids, pool, table, lengths):
    """Feeds each row's first lengths[s] tokens in two chunks; returns the logits of every
    position fed [S, T_MAX, V] (garbage past lengths) and the pool."""
    split = lengths // 2
    out = jnp.zeros((S, T_MAX, model.config.vocab_size), jnp.float32)
    for lo, hi in ((np.zeros_like(lengths), split), (split, lengths)):
        positions = _chunk_positions(lo, hi, int((hi - lo).max()))
        tokens = jnp.take_along_axis(ids, jnp.minimum(positions, T_MAX - 1), axis=1)
        logits, pool = paged_forward(model, tokens, positions, pool, table, T_MAX,
                                     last_only=False)
        rows = jnp.arange(S)[:, None]
        out = out.at[rows, positions].set(logits, mode="drop")
    return out, pool


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_paged_prefill_in_chunks_equals_the_full_forward(name):
    model = _model(name)
    rng = np.random.default_rng(1)
    ids, pool, table = _setup(model.config, rng)
    lengths = np.array([T_MAX - 1, 7, 100, PAGE * 3, 1])  # one ending on a page boundary

    logits, new_pool = jax.jit(lambda ids, pool: _prefill(model, ids, pool, table, lengths))(
        ids, pool)
    want = np.asarray(model(ids))
    for s, n in enumerate(lengths):
        np.testing.assert_allclose(np.asarray(logits)[s, :n], want[s, :n], rtol=2e-4,
                                   atol=2e-4)
    # Pages nobody lists stay untouched; a row's pages past its length too.
    listed = set(np.asarray(table).ravel().tolist())
    for k in new_pool.k:
        k = np.asarray(k)
        assert all(not k[p].any() for p in range(k.shape[0]) if p not in listed)
        assert not k[np.asarray(table)[4, 1:]].any()  # row 4 holds one position


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ragged_decode_equals_the_full_forward_on_random_lengths(name):
    model = _model(name)
    cfg = model.config
    rng = np.random.default_rng(0)
    ids, pool, table = _setup(cfg, rng)
    start = rng.integers(1, T_MAX - 4, size=S).astype(np.int32)
    start[0] = PAGE * 3  # a row ending on a page boundary
    active = jnp.asarray([True, True, False, True, True])
    steps = 3

    @jax.jit
    def run(ids, pool):
        _, pool = _prefill(model, ids, pool, table, start)
        shape = (S, cfg.num_kv_heads, steps, cfg.head_dim)
        fresh = KVCache(*(tuple(jnp.zeros(shape) for _ in range(cfg.num_layers))
                          for _ in range(2)))
        start_s = jnp.asarray(start)
        outs = []
        for step in range(steps):  # the call's earlier steps come from `fresh`
            pos = start_s + step
            tokens = ids[jnp.arange(S), pos]
            logits, fresh = paged_decode_step(model, tokens, pos, pool, table, fresh,
                                              jnp.int32(step), start_s, active)
            outs.append(logits)
        return jnp.stack(outs, 1)  # [S, steps, V]

    got = np.asarray(run(ids, pool))
    want = np.asarray(model(ids))
    for s in np.flatnonzero(np.asarray(active)):
        np.testing.assert_allclose(got[s], want[s, start[s]:start[s] + steps], rtol=2e-4,
                                   atol=2e-4)
