"""The fused-decode path (`decode_step` + `KVCache.write_fresh`) against `forward_cached`.

The engine's decode loop reads the cache and keeps the K/V of its steps in a side buffer,
written into the cache after the loop; one `forward_cached` call per step writes them as it
goes. Both must give the same logits and leave the same cache, sliding windows and logit
soft-capping included, and slots that decode fewer steps (or none) must write only those.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentax.models import ModelConfig, Transformer, init_cache

S, T_MAX, STEPS, SPAN = 3, 32, 4, 16


@functools.partial(jax.jit, static_argnums=(0,))
def _per_step(graphdef, state, cache, tokens_sn, start_s, counts_s):
    """Reference: one forward_cached call per step; slot s writes only its first counts_s."""
    model = nnx.merge(graphdef, state)
    logits = []
    for i in range(STEPS):
        pos = jnp.where(i < counts_s, start_s + i, T_MAX)  # T_MAX writes nothing
        out, cache = model.forward_cached(tokens_sn[:, i: i + 1], pos[:, None], cache)
        logits.append(out[:, 0])
    return jnp.stack(logits, 1), cache


@functools.partial(jax.jit, static_argnums=(0,))
def _fused(graphdef, state, cache, tokens_sn, start_s, counts_s):
    model = nnx.merge(graphdef, state)
    span = type(cache)(*(tuple(c[:, :, :SPAN] for c in part) for part in (cache.k, cache.v)))
    fresh = cache.fresh(STEPS)
    logits = []
    for i in range(STEPS):
        out, fresh = model.decode_step(tokens_sn[:, i], start_s + i, span, fresh, jnp.int32(i),
                                       start_s, SPAN)
        logits.append(out)
    return jnp.stack(logits, 1), cache.write_fresh(fresh, start_s, counts_s)


@pytest.mark.parametrize("kind", ["qwen3", "gemma3_like"])
def test_fused_decode_equals_per_step_forward_cached(kind):
    overrides = dict(hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=16)
    if kind == "gemma3_like":  # a window shorter than the filled length, soft-capped logits
        overrides.update(layer_types=("sliding", "full"), sliding_window=6, post_norms=True,
                         attn_logit_softcap=20.0, norm_plus_one=True)
    model = Transformer(ModelConfig.tiny(**overrides), rngs=nnx.Rngs(1))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    # Fill the first 12 positions of every slot with real K/V (a prefill).
    prompt = jnp.asarray(rng.integers(0, 256, size=(S, 12)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (S, 12))
    _, cache = jax.jit(lambda c: model.forward_cached(prompt, pos, c))(init_cache(model.config, S, T_MAX))
    tokens = jnp.asarray(rng.integers(0, 256, size=(S, STEPS)), jnp.int32)
    start = jnp.asarray([12, 9, 11], jnp.int32)  # slots at different lengths
    counts = jnp.asarray([STEPS, 2, 0], jnp.int32)  # one stops early, one is idle
    ref_logits, ref_cache = _per_step(graphdef, state, cache, tokens, start, counts)
    logits, new_cache = _fused(graphdef, state, cache, tokens, start, counts)
    for s in range(S):
        n = int(counts[s])
        np.testing.assert_allclose(logits[s, :n], ref_logits[s, :n], atol=2e-5, rtol=2e-5)
    for ref, got in zip(ref_cache.k + ref_cache.v, new_cache.k + new_cache.v):
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=2e-5)  # later layers: rounding
    # The idle slot's cache is untouched; the early stopper wrote exactly 2 positions.
    np.testing.assert_array_equal(new_cache.k[0][2], cache.k[0][2])
    changed = np.any(np.asarray(new_cache.k[0][1] != cache.k[0][1]), axis=(0, 2))
    assert np.flatnonzero(changed).tolist() == [9, 10]


@pytest.mark.parametrize("steps", [1, 4])
def test_decode_kernel_copies_no_cache(steps):
    # The decode kernel donates the cache and writes it in place: a copy of a whole cache
    # buffer (what an unrolled step or a span sliced inside the loop made XLA do) costs more
    # than the step itself at long max_seq_len.
    from agentax.engine._kernels import ModelDef, decode_steps
    from agentax.engine._sampling import RowSampling

    model = Transformer(ModelConfig.tiny(num_layers=2), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    weights, treedef = jax.tree.flatten(state)
    s, t_max = 4, 256
    cache = init_cache(model.config, s, t_max)
    ones = jnp.ones((s,), jnp.float32)
    sampling = RowSampling(ones, jnp.zeros((s,), jnp.int32), ones, jnp.zeros((s,), jnp.uint32))
    hlo = decode_steps.lower(
        ModelDef(graphdef, treedef), weights, cache, jnp.zeros((4, s), jnp.int32), sampling,
        jnp.full((s, 8), -1, jnp.int32), steps, 64,
    ).compile().as_text()
    cache_shape = "f32[%d,%d,%d,%d]" % cache.k[0].shape
    copies = [line for line in hlo.splitlines() if f"= {cache_shape}" in line and " copy(" in line]
    assert not copies, copies[:2]
