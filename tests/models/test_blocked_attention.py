"""The blocked (flash) training attention against the dense reference, its block skipping,
and its memory: values and gradients, jitted, for causal, GQA, packed segments, windows
(static and traced under `lax.scan`), soft-cap, ragged T, bf16 and fully padded rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentax.models import _attention
from agentax.models._attention import (
    dense_attention_pays,
    resolve_attention_block,
    resolve_attention_impl,
    train_attention,
)

SCALE = 0.35


def _inputs(b, t, n, kv, h, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(b, t, n, h)), dtype)
    k = jnp.asarray(rng.normal(size=(b, t, kv, h)), dtype)
    v = jnp.asarray(rng.normal(size=(b, t, kv, h)), dtype)
    weights = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
    return q, k, v, weights


@functools.partial(jax.jit, static_argnames=("impl", "block", "softcap", "window"))
def _value_and_grads(q, k, v, weights, segment_ids_bt, *, impl, block, softcap, window):
    """A random-weighted sum of the output and its gradients w.r.t. q, k, v."""
    def loss(q, k, v):
        out = train_attention(q, k, v, segment_ids_bt=segment_ids_bt, window=window,
                              scale=SCALE, softcap=softcap, impl=impl, block=block)
        return (out.astype(jnp.float32) * weights).sum(), out
    (value, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return value, out, grads


def _assert_close(blocked, dense, tol):
    for got, want in zip(jax.tree.leaves(blocked), jax.tree.leaves(dense)):
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   rtol=tol, atol=tol)


# Two rows: several segments then a padding tail, and one segment that starts mid-row.
_SEG_13 = np.array([[1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 0, 0, 0],
                    [4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5]], np.int32)

CASES = {
    "causal": dict(shape=(2, 16, 4, 4, 8), block=4),
    "gqa": dict(shape=(2, 16, 4, 2, 8), block=4),
    "segments_with_padding": dict(shape=(2, 13, 4, 2, 8), block=4, segments=_SEG_13),
    "window": dict(shape=(2, 16, 4, 2, 8), block=4, window=5),
    "window_and_segments": dict(shape=(2, 13, 4, 2, 8), block=4, window=3, segments=_SEG_13),
    "softcap": dict(shape=(2, 16, 4, 2, 8), block=4, softcap=2.0),
    "t_not_multiple_of_block": dict(shape=(1, 13, 4, 2, 8), block=4),
    "t_below_block": dict(shape=(2, 7, 4, 2, 8), block=512, softcap=5.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_blocked_matches_dense_values_and_grads(case):
    spec = CASES[case]
    q, k, v, weights = _inputs(*spec["shape"])
    seg = spec.get("segments")
    if seg is not None:
        seg = jnp.asarray(seg)
        # Padding rows are garbage in dense and 0 in blocked: weigh them out of the loss.
        weights = weights * (seg != 0)[:, :, None, None]
    kw = dict(block=spec["block"], softcap=spec.get("softcap"), window=spec.get("window"))
    value, out, grads = _value_and_grads(q, k, v, weights, seg, impl="blocked", **kw)
    ref_value, ref_out, ref_grads = _value_and_grads(q, k, v, weights, seg, impl="dense", **kw)
    if seg is not None:
        real = np.asarray(seg != 0)
        out, ref_out = np.asarray(out)[real], np.asarray(ref_out)[real]
    _assert_close((value, out, grads), (ref_value, ref_out, ref_grads), 1e-5)


def test_traced_window_under_scan_with_remat():
    """Two "layers" under lax.scan, windows [0 (none), 5] as scanned data, body remat'd."""
    q, k, v, weights = _inputs(2, 16, 4, 2, 8, seed=1)

    @functools.partial(jax.jit, static_argnames="impl")
    def value_and_grads(q, k, v, windows, impl):
        def loss(q, k, v):
            @jax.checkpoint
            def layer(x, window):
                out = train_attention(x, k, v, window=window, scale=SCALE, softcap=None,
                                      impl=impl, block=4)
                return x + out, None
            x, _ = jax.lax.scan(layer, q, windows)
            return (x * weights).sum()
        return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)

    windows = jnp.asarray([0, 5], jnp.int32)
    blocked = value_and_grads(q, k, v, windows, "blocked")
    _assert_close(blocked, value_and_grads(q, k, v, windows, "dense"), 1e-5)
    # The traced window is applied: without it the answer differs.
    no_window = value_and_grads(q, k, v, jnp.asarray([0, 0], jnp.int32), "blocked")
    assert abs(float(no_window[0]) - float(blocked[0])) > 1e-3


def test_bf16_close_to_dense():
    q, k, v, weights = _inputs(2, 32, 4, 2, 16, dtype=jnp.bfloat16, seed=2)
    kw = dict(block=8, softcap=None, window=None)
    value, out, grads = _value_and_grads(q, k, v, weights, None, impl="blocked", **kw)
    ref_value, ref_out, ref_grads = _value_and_grads(q, k, v, weights, None, impl="dense", **kw)
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
    _assert_close(out, ref_out, 2e-2)
    _assert_close(grads, ref_grads, 5e-2)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=2e-2)


def test_fully_padded_row_is_finite_and_zero():
    q, k, v, weights = _inputs(2, 12, 4, 2, 8, seed=3)
    seg = jnp.asarray([[0] * 12, [1] * 5 + [2] * 7], jnp.int32)
    value, out, grads = _value_and_grads(q, k, v, weights, seg, impl="blocked", block=4,
                                         softcap=3.0, window=None)
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(x)).all() for x in (out, *grads))
    np.testing.assert_array_equal(np.asarray(out[0]), 0.0)
    np.testing.assert_array_equal(np.asarray(grads[0][0]), 0.0)  # no query of row 0 sees a key


def _visited(lo, hi):
    return int(np.sum(np.asarray(hi) - np.asarray(lo)))


def test_kv_block_range_skips_masked_blocks():
    t, block = 64, 8
    nb = t // block
    lo, hi = _attention._kv_block_range(t, block)
    np.testing.assert_array_equal(lo, 0)
    np.testing.assert_array_equal(hi, np.arange(1, nb + 1))
    assert _visited(lo, hi) == nb * (nb + 1) // 2  # 36 of 64: causal halves the work
    # Window 5: query block i (first query 8i) needs keys from 8i - 4, so blocks i-1 and i.
    lo, hi = _attention._kv_block_range(t, block, window=jnp.int32(5))
    np.testing.assert_array_equal(lo, np.maximum(np.arange(nb) - 1, 0))
    assert _visited(lo, hi) == 1 + 2 * (nb - 1)
    lo0, _ = _attention._kv_block_range(t, block, window=jnp.int32(0))  # traced 0 = none
    np.testing.assert_array_equal(lo0, 0)
    # Segments: runs [0, 20), [20, 44), [44, 56), padding [56, 64). Query block 3 (24..31)
    # starts in the run from 20 -> key block 2; block 7 is all padding -> nothing.
    seg = np.repeat([1, 2, 3, 0], [20, 24, 12, 8])[None]
    lo, hi = _attention._kv_block_range(t, block, jnp.asarray(seg))
    np.testing.assert_array_equal(lo, [0, 0, 0, 2, 2, 2, 5, 7])
    np.testing.assert_array_equal(hi, [1, 2, 3, 4, 5, 6, 7, 7])
    # A second row whose segment starts earlier widens the range (min over rows).
    seg2 = np.concatenate([seg, np.repeat([1, 2], [4, 60])[None]])
    lo, _ = _attention._kv_block_range(t, block, jnp.asarray(seg2))
    np.testing.assert_array_equal(lo, [0, 0, 0, 0, 0, 0, 0, 0])


def test_kernel_visits_only_the_given_range(monkeypatch):
    """The loops follow `_kv_block_range`: an empty range gives zeros, a full one (no
    skipping) gives the same result as the skipping one."""
    q, k, v, weights = _inputs(1, 16, 4, 2, 8, seed=4)
    attend = jax.jit(lambda q, k, v: train_attention(q, k, v, window=5, scale=SCALE,
                                                     softcap=None, block=4))
    skipping = attend(q, k, v)

    def full(t_pad, block, *args, **kwargs):
        nb = t_pad // block
        return jnp.zeros((nb,), jnp.int32), jnp.full((nb,), nb, jnp.int32)

    monkeypatch.setattr(_attention, "_kv_block_range", full)
    attend = jax.jit(lambda q, k, v: train_attention(q, k, v, window=5, scale=SCALE,
                                                     softcap=None, block=4))
    np.testing.assert_allclose(attend(q, k, v), skipping, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(_attention, "_kv_block_range",
                        lambda t_pad, block, *a, **kw: full(t_pad, block)[::-1])
    attend = jax.jit(lambda q, k, v: train_attention(q, k, v, window=5, scale=SCALE,
                                                     softcap=None, block=4))
    np.testing.assert_array_equal(attend(q, k, v), 0.0)


def _grad_temp_bytes(t, n=16, kv=8, h=128):
    """Temporaries of the jitted value_and_grad of blocked attention, compiled only."""
    q = jax.ShapeDtypeStruct((1, t, n, h), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, t, kv, h), jnp.bfloat16)

    def loss(q, k, v):
        out = train_attention(q, k, v, scale=0.1, softcap=None, impl="blocked", block=512)
        return out.astype(jnp.float32).sum()

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, k, k).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_memory_is_linear_in_t():
    """At T=8192 the gradient's temporaries stay far below one [T, T] f32 score matrix per
    head (16 * 8192^2 * 4 B = 4 GiB), and doubling T about doubles them (not 4x)."""
    temp_8k = _grad_temp_bytes(8192)
    assert temp_8k < 512 * 2**20, f"{temp_8k / 2**20:.0f} MiB of temporaries"
    assert temp_8k < 2.5 * _grad_temp_bytes(4096)


def test_resolve_impl_and_cudnn_refusals():
    assert resolve_attention_impl("auto", softcap=None, segmented=False, backend="gpu") == "cudnn"
    assert resolve_attention_impl("auto", softcap=30.0, segmented=False, backend="gpu") == "blocked"
    assert resolve_attention_impl("auto", softcap=None, segmented=True, backend="gpu") == "blocked"
    assert resolve_attention_impl("auto", softcap=None, segmented=False, backend="gpu",
                                  traced_window=True) == "blocked"
    assert resolve_attention_impl("auto", softcap=None, segmented=False, backend="cpu") == "blocked"
    assert resolve_attention_impl("dense", softcap=30.0, segmented=True) == "dense"
    with pytest.raises(ValueError, match="unknown attention impl"):
        resolve_attention_impl("flash", softcap=None, segmented=False)
    q, k, v, _ = _inputs(1, 8, 2, 1, 8, dtype=jnp.bfloat16)
    for kw, match in [(dict(softcap=5.0), "soft-cap"),
                      (dict(segment_ids_bt=jnp.ones((1, 8), jnp.int32)), "segment"),
                      (dict(window=jnp.int32(4)), "traced")]:
        kw = {"softcap": None, **kw}
        with pytest.raises(ValueError, match=match):
            train_attention(q, k, v, scale=1.0, impl="cudnn", **kw)
    with pytest.raises(ValueError, match="bf16/fp16"):
        train_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                        scale=1.0, softcap=None, impl="cudnn")


def test_auto_block_and_the_dense_rule_per_backend():
    """'auto' on CPU: blocks of twice the head dim, dense only for small scores or two blocks;
    an accelerator keeps 512-blocks and dense up to 256 MiB of scores; an explicit block wins."""
    assert resolve_attention_block(0, 32, backend="cpu") == 64
    assert resolve_attention_block(0, 128, backend="cpu") == 256
    assert resolve_attention_block(0, 256, backend="cpu") == 512
    assert resolve_attention_block(0, 128, backend="tpu") == 512
    assert resolve_attention_block(96, 32, backend="cpu") == 96
    # the mini_swe recipe's SFT rows (32 x 384, 4 heads): 75 MiB of scores, six blocks
    assert not dense_attention_pays(32, 4, 384, 64, backend="cpu")
    assert dense_attention_pays(32, 4, 384, 512, backend="gpu")
    assert dense_attention_pays(32, 4, 128, 64, backend="cpu")  # 8 MiB
    assert dense_attention_pays(1, 16, 1024, 512, backend="cpu")  # two blocks
    assert not dense_attention_pays(1, 16, 8192, 512, backend="tpu")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU's rule")
def test_auto_attention_on_cpu_matches_dense_through_the_trainers_forward():
    """Packed rows long enough for 'auto' to pick the blocked kernel (its loops are in the
    program) give the dense numbers."""
    from agentax.models import ModelConfig, Transformer

    model = Transformer(ModelConfig.tiny(num_layers=1))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 256, (16, 320)), jnp.int32)
    seg = jnp.asarray(np.repeat([[1] * 140 + [2] * 150 + [0] * 30], 16, axis=0), jnp.int32)
    assert not dense_attention_pays(16, model.config.num_heads, 320,
                                    resolve_attention_block(0, model.config.head_dim))
    def run(attention):
        fn = jax.jit(lambda i, s: model.hidden(i, segment_ids_bt=s, attention=attention))
        return fn(ids, seg), "while" in str(jax.make_jaxpr(fn)(ids, seg))

    (auto, auto_loops), (dense, dense_loops) = run("auto"), run("dense")
    assert auto_loops and not dense_loops
    real = np.asarray(seg) > 0
    np.testing.assert_allclose(np.asarray(auto)[real], np.asarray(dense)[real],
                               atol=2e-5, rtol=2e-5)
