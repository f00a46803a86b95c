"""Training attention without a [T, T] matrix: a blocked (flash) kernel in pure JAX, cuDNN, and
the dense reference.

`train_attention` is the full-sequence attention of a training forward: causal by row index,
optionally limited to a sliding window and to packed segments, grouped-query, with Gemma's
optional logit soft-cap. Its three implementations give the same numbers:

* "dense" builds the [B, T, T] mask and calls `_layers.attention` (the reference).
* "blocked" is FlashAttention-2 (Dao, 2023, https://arxiv.org/abs/2307.08691) written with
  `lax` loops and a `jax.custom_vjp`: an online softmax over key blocks in the forward, which
  keeps only the output and each row's logsumexp; a backward that recomputes the probabilities
  block by block. Memory is O(T * block). Key blocks that no query of a query block may see
  are never visited (see `_kv_block_range`): causal attention costs about half of dense and a
  sliding window of w costs O(T * w). Departures from the paper: the loops are XLA while loops
  rather than a fused GPU kernel, and the backward runs one pass over query blocks, adding
  into float32 dK/dV buffers, instead of the paper's loop over key blocks.
* "cudnn" is `jax.nn.dot_product_attention(implementation="cudnn")` (GPU, bf16/fp16, no
  soft-cap, no packed segments, a window only as a Python int).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from agentax.models._layers import attention as dense_attention

__all__ = ["train_attention", "resolve_attention_impl", "resolve_attention_block",
           "dense_attention_pays", "ATTENTION_IMPLS"]

ATTENTION_IMPLS = ("auto", "dense", "blocked", "cudnn")


DENSE_SCORES_BYTES = 1 << 28
"""`attention='auto'` on an accelerator runs the dense attention when one layer's float32
scores [B, N, T, T] fit in this many bytes (256 MiB; with remat one layer's are live at a
time): the blocked kernel's loops cost more to compile than such a small problem saves, and
real lengths are far past it (Qwen3-0.6B at 4k tokens: 1 GiB a row)."""

CPU_DENSE_SCORES_BYTES = 1 << 24
"""On CPU `attention='auto'` runs the dense attention only when one layer's float32 scores fit
in this many bytes (16 MiB) or the sequence is at most two blocks long: past that the blocked
kernel's skipped blocks (causal, other packed segments) and cache-sized tiles beat the dense
[T, T] passes through memory (`benchmarks/train.py`, `attention_blocked_over_dense`)."""


def resolve_attention_block(block: int, head_dim: int, backend: str | None = None) -> int:
    """The blocked attention's block size; `block` 0 is automatic: 512 on an accelerator, and
    on CPU twice the head dimension within [64, 512] (a score tile that stays in cache)."""
    if block:
        return block
    if (backend or jax.default_backend()) != "cpu":
        return 512
    return min(512, max(64, 2 * head_dim))


def dense_attention_pays(b: int, num_heads: int, t: int, block: int,
                         backend: str | None = None) -> bool:
    """Whether `attention='auto'` runs the dense attention for B x T tokens (see
    DENSE_SCORES_BYTES and CPU_DENSE_SCORES_BYTES)."""
    scores = b * num_heads * t * t * 4
    if (backend or jax.default_backend()) == "cpu":
        return scores <= CPU_DENSE_SCORES_BYTES or t <= 2 * block
    return scores <= DENSE_SCORES_BYTES


def resolve_attention_impl(impl: str, *, softcap: float | None, segmented: bool,
                           backend: str | None = None, traced_window: bool = False,
                           dtype=None) -> str:
    """The implementation "auto" stands for; any other name is returned as it is.

    "auto" is "cudnn" on a GPU backend when cuDNN can run the inputs (no soft-cap, no packed
    segments, a static window, bf16/fp16 when `dtype` is given), else "blocked".
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"unknown attention impl '{impl}': use one of {ATTENTION_IMPLS}")
    if impl != "auto":
        return impl
    backend = backend or jax.default_backend()
    cudnn_dtype = dtype is None or jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
    if (backend in ("gpu", "cuda") and softcap is None and not segmented
            and not traced_window and cudnn_dtype):
        return "cudnn"
    return "blocked"


def train_attention(
    q_btnh: jax.Array,
    k_btkh: jax.Array,
    v_btkh: jax.Array,
    *,
    segment_ids_bt: jax.Array | None = None,
    window: int | jax.Array | None = None,
    scale: float,
    softcap: float | None,
    impl: str = "blocked",
    block: int = 512,
) -> jax.Array:
    """Causal grouped-query self-attention of a full sequence; returns [B, T, N, H] in v's dtype.

    Query i sees key j iff j <= i (by index, not by RoPE position), j > i - window when a
    window is set, and seg[i] == seg[j] != 0 when segment ids are given. A query that sees no
    key (padding) gives finite values and gradients (0 with "blocked").

    Args:
      q_btnh: [B, T, N, H] queries; query head n uses kv head n // (N // K).
      k_btkh: [B, T, K, H] keys.
      v_btkh: [B, T, K, H] values.
      segment_ids_bt: [B, T] int packed-sequence ids, 0 for padding. Each id must fill one
        contiguous run of its row (as `positions_from_segments` also assumes): "blocked" skips
        key blocks before the run of a block's first query.
      window: sliding window w: None, a Python int, or a traced int32 scalar (per-layer data
        under `lax.scan`); 0 means no window.
      scale: multiplies q (in q's dtype) before the scores.
      softcap: Gemma's logit soft-cap `tanh(s / cap) * cap`, or None.
      impl: "dense", "blocked", "cudnn" or "auto" (see `resolve_attention_impl`).
      block: query/key block length of "blocked"; capped at T.

    Returns:
      [B, T, N, H] attention output.
    """
    b, t, n, h = q_btnh.shape
    kv = k_btkh.shape[2]
    if k_btkh.shape != (b, t, kv, h) or v_btkh.shape != k_btkh.shape:
        raise ValueError(f"k and v must be [B, T, K, H] = {(b, t, kv, h)}, "
                         f"got {k_btkh.shape} and {v_btkh.shape}")
    if n % kv:
        raise ValueError(f"query heads ({n}) must be a multiple of kv heads ({kv})")
    if segment_ids_bt is not None and segment_ids_bt.shape != (b, t):
        raise ValueError(f"segment_ids_bt must be [B, T] = {(b, t)}, got {segment_ids_bt.shape}")
    static_window = window is None or isinstance(window, (int, np.integer))
    if static_window and window is not None and window < 0:
        raise ValueError(f"window must be >= 0 (0 = no window), got {window}")
    has_window = not (window is None or (static_window and window == 0))
    impl = resolve_attention_impl(impl, softcap=softcap, segmented=segment_ids_bt is not None,
                                  traced_window=not static_window, dtype=q_btnh.dtype)
    window = window if has_window else None
    # A sequence of at most one block is one block of the blocked attention: run it densely
    # (the same [T, T] <= [block, block] working set, none of the loops' overhead).
    if impl == "dense" or (impl == "blocked" and t <= block):
        mask = _dense_mask(t, segment_ids_bt, window)
        return dense_attention(q_btnh, k_btkh, v_btkh, mask, scale=scale, softcap=softcap)
    if impl == "cudnn":
        return _cudnn_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt=segment_ids_bt,
                                window=window, scale=scale, softcap=softcap)
    return _blocked_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, window, scale=scale,
                              softcap=softcap, block=block)


def _dense_mask(t: int, segment_ids_bt, window) -> jax.Array:
    """[B or 1, T, T] boolean mask of the dense reference."""
    idx = jnp.arange(t)
    mask = _pair_mask(idx, idx, window)[None]
    if segment_ids_bt is not None:
        mask = mask & _segment_mask(segment_ids_bt, segment_ids_bt)
    return mask


def _pair_mask(q_idx, k_idx, window) -> jax.Array:
    """[Tq, Tk] causal (+ window) mask; a traced window of 0 means no window."""
    mask = k_idx[None, :] <= q_idx[:, None]
    if window is not None:
        window = jnp.asarray(window, jnp.int32)
        mask &= (window <= 0) | (k_idx[None, :] > q_idx[:, None] - window)
    return mask


def _segment_mask(seg_q_bt, seg_k_bs) -> jax.Array:
    """[B, Tq, Tk]: same segment, and the key is not padding."""
    return (seg_q_bt[:, :, None] == seg_k_bs[:, None, :]) & (seg_k_bs[:, None, :] != 0)


# ------------------------------------------------------------------------------ cuDNN


def _cudnn_attention(q_btnh, k_btkh, v_btkh, *, segment_ids_bt, window, scale, softcap):
    """cuDNN flash attention. Raises ValueError for what cuDNN cannot do."""
    if softcap is not None:
        raise ValueError("attention impl 'cudnn' has no logit soft-cap: use 'blocked'")
    if segment_ids_bt is not None:
        raise ValueError("attention impl 'cudnn' does not take packed segment ids "
                         "(jax.nn.dot_product_attention has none): use 'blocked'")
    if window is not None and not isinstance(window, (int, np.integer)):
        raise ValueError("attention impl 'cudnn' needs the window as a Python int, got a traced "
                         "value (layers under lax.scan): use 'blocked' or unscanned layers")
    if q_btnh.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"attention impl 'cudnn' runs bf16/fp16 only, got {q_btnh.dtype}: "
                         "use 'blocked'")
    # jax's (left, right) window: query i sees keys [i - left, i + right]; ours sees
    # (i - w, i], so left = w - 1 (cuDNN's sliding_window_length becomes left + 1 = w).
    local = None if window is None else (int(window) - 1, 0)
    q_btnh = q_btnh * jnp.asarray(scale, q_btnh.dtype)  # as the dense path scales
    out = jax.nn.dot_product_attention(
        q_btnh, k_btkh, v_btkh, scale=1.0, is_causal=True, local_window_size=local,
        implementation="cudnn",
    )
    return out.astype(v_btkh.dtype)


# ------------------------------------------------------------------------------ blocked


@dataclasses.dataclass(frozen=True)
class _Static:
    """What the blocked kernel specializes on (hashable: a custom_vjp nondiff arg)."""

    block: int
    scale: float
    softcap: float | None
    has_window: bool
    has_segments: bool


def _kv_block_range(t_pad: int, block: int, segment_ids_bt=None, window=None):
    """Key blocks each query block visits: [lo[i], hi[i]) for query block i, int32 [T/block].

    Causality bounds hi by i + 1. The window bounds lo by the block holding key qs - w + 1
    (qs = the block's first query). With packed segments lo is also bounded by the start of
    the segment run of the block's first query (later queries' runs start no earlier), the
    smallest over the batch rows; a block whose queries are all padding visits nothing.
    """
    num_blocks = t_pad // block
    q_start = jnp.arange(num_blocks, dtype=jnp.int32) * block
    lo_idx = jnp.zeros((num_blocks,), jnp.int32)
    hi = jnp.arange(1, num_blocks + 1, dtype=jnp.int32)
    if window is not None:
        window = jnp.asarray(window, jnp.int32)
        lo_idx = jnp.where(window > 0, jnp.maximum(q_start - window + 1, 0), 0)
    if segment_ids_bt is not None:
        seg = segment_ids_bt
        idx = jnp.arange(t_pad, dtype=jnp.int32)
        new_run = jnp.concatenate(
            [jnp.ones((seg.shape[0], 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
        run_start_bt = lax.cummax(jnp.where(new_run, idx, 0), axis=1)  # [B, T]
        lo_idx = jnp.maximum(lo_idx, run_start_bt[:, ::block].min(axis=0))
        all_padding = (seg.reshape(seg.shape[0], num_blocks, block) == 0).all(axis=(0, 2))
        hi = jnp.where(all_padding, lo_idx // block, hi)
    return lo_idx // block, hi


def _kv_block(k, v, start, size: int):
    """Keys and values [B, size, K, H] of the key block starting at `start` (traced)."""
    return (lax.dynamic_slice_in_dim(k, start, size, 1),
            lax.dynamic_slice_in_dim(v, start, size, 1))


def _blocked_attention(q_btnh, k_btkh, v_btkh, segment_ids_bt, window, *, scale, softcap,
                       block):
    """Pads T to a multiple of the block and runs the flash kernel."""
    b, t, n, h = q_btnh.shape
    kv = k_btkh.shape[2]
    block = max(1, min(block, t))
    t_pad = -(-t // block) * block
    pad = [(0, 0), (0, t_pad - t), (0, 0), (0, 0)]
    # Padded keys sit after every real query, so causality already hides them; padded
    # queries' outputs are sliced off (their cotangent is 0).
    q = jnp.pad(q_btnh, pad).reshape(b, t_pad, kv, n // kv, h)  # [B, T, K, G, H]
    k, v = jnp.pad(k_btkh, pad), jnp.pad(v_btkh, pad)
    seg = None
    if segment_ids_bt is not None:
        seg = jnp.pad(segment_ids_bt.astype(jnp.int32), [(0, 0), (0, t_pad - t)])
    window_arr = jnp.asarray(0 if window is None else window, jnp.int32)
    lo, hi = _kv_block_range(t_pad, block, seg, window)
    static = _Static(block=block, scale=float(scale), softcap=softcap,
                     has_window=window is not None, has_segments=seg is not None)
    out = _flash(static, q, k, v, seg, window_arr, lo, hi)  # [B, T, K, G, H]
    return out.reshape(b, t_pad, n, h)[:, :t]


def _block_mask(static: _Static, q_start, k_start, seg, window) -> jax.Array:
    """[B or 1, 1, 1, Bq, Bk] mask of one (query block, key block) pair."""
    q_idx = q_start + jnp.arange(static.block)
    k_idx = k_start + jnp.arange(static.block)
    mask = _pair_mask(q_idx, k_idx, window if static.has_window else None)[None]
    if static.has_segments:
        seg_q = lax.dynamic_slice_in_dim(seg, q_start, static.block, 1)
        seg_k = lax.dynamic_slice_in_dim(seg, k_start, static.block, 1)
        mask = mask & _segment_mask(seg_q, seg_k)
    return mask[:, None, None]


def _scaled_block(static: _Static, q, start):
    """One query block times the scale, in q's dtype as the dense path does; scaling per block
    keeps a scaled copy of the whole q out of memory and out of the residuals."""
    q_blk = lax.dynamic_slice_in_dim(q, start, static.block, 1)
    return q_blk * jnp.asarray(static.scale, q.dtype)


def _scores(static: _Static, q_blk, k_blk):
    """Float32 (soft-capped) scores [B, K, G, Bq, Bk] and tanh(s / cap) for the backward."""
    s = jnp.einsum("bqkgh,bskh->bkgqs", q_blk, k_blk, preferred_element_type=jnp.float32)
    if static.softcap is None:
        return s, None
    tanh = jnp.tanh(s / static.softcap)
    return tanh * static.softcap, tanh


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static, q, k, v, seg, window, lo, hi):
    return _flash_forward(static, q, k, v, seg, window, lo, hi)[0]


def _flash_forward(static, q, k, v, seg, window, lo, hi):
    """Output [B, T, K, G, H] and logsumexp [B, K, G, T] (0 on rows that see nothing, whose
    output is 0)."""
    b, t_pad, kv, g, h = q.shape
    bs = static.block

    def query_block(qi):
        q_start = qi * bs
        q_blk = _scaled_block(static, q, q_start)  # [B, Bq, K, G, H]

        def key_block(kj, carry):
            m, l, acc = carry
            k_start = kj * bs
            k_blk, v_blk = _kv_block(k, v, k_start, bs)  # [B, Bk, K, H] each
            s, _ = _scores(static, q_blk, k_blk)
            s = jnp.where(_block_mask(static, q_start, k_start, seg, window), s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(axis=-1))
            # A row that has seen nothing keeps m = -inf: shift by 0 so exp gives 0, not NaN.
            m_shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
            p = jnp.exp(s - m_shift[..., None])
            alpha = jnp.exp(m - m_shift)
            pv = jnp.einsum("bkgqs,bskh->bkgqh", p.astype(v.dtype), v_blk,
                            preferred_element_type=jnp.float32)
            return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + pv

        init = (jnp.full((b, kv, g, bs), -jnp.inf, jnp.float32),
                jnp.zeros((b, kv, g, bs), jnp.float32),
                jnp.zeros((b, kv, g, bs, h), jnp.float32))
        m, l, acc = lax.fori_loop(lo[qi], hi[qi], key_block, init)
        seen = l > 0
        l_safe = jnp.where(seen, l, 1.0)
        out = (acc / l_safe[..., None]).astype(v.dtype)  # [B, K, G, Bq, H]
        lse = jnp.where(seen, m + jnp.log(l_safe), 0.0)
        return jnp.moveaxis(out, 3, 1), lse

    def write_block(qi, carry):
        # Written in place: a stacked lax.map output would need a transposing copy.
        out, lse = carry
        out_blk, lse_blk = query_block(qi)
        return (lax.dynamic_update_slice_in_dim(out, out_blk, qi * bs, 1),
                lax.dynamic_update_slice_in_dim(lse, lse_blk, qi * bs, 3))

    init = (jnp.zeros(q.shape, v.dtype), jnp.zeros((b, kv, g, t_pad), jnp.float32))
    out, lse = lax.fori_loop(0, t_pad // bs, write_block, init)
    return out, (q, k, v, seg, window, lo, hi, out, lse)


def _flash_backward(static, residuals, dout):
    """FlashAttention-2's backward: P = exp(S - lse), dS = P * (dP - rowsum(dO * O))."""
    q, k, v, seg, window, lo, hi, out, lse = residuals
    b, t_pad, kv, g, h = q.shape
    bs = static.block
    # A fused multiply-reduce (an einsum would materialize float32 copies of dO and O).
    delta = jnp.moveaxis((dout.astype(jnp.float32) * out.astype(jnp.float32)).sum(-1),
                         1, -1)  # [B, K, G, T]

    def query_block(qi, grads):
        dq_all, dk, dv = grads
        q_start = qi * bs
        q_blk = _scaled_block(static, q, q_start)  # [B, Bq, K, G, H]
        do_blk = lax.dynamic_slice_in_dim(dout, q_start, bs, 1)
        delta_blk = lax.dynamic_slice_in_dim(delta, q_start, bs, 3)  # [B, K, G, Bq]
        lse_blk = lax.dynamic_slice_in_dim(lse, q_start, bs, 3)  # [B, K, G, Bq]

        def key_block(kj, carry):
            dq, dk, dv = carry
            k_start = kj * bs
            k_blk, v_blk = _kv_block(k, v, k_start, bs)  # [B, Bk, K, H] each
            s, tanh = _scores(static, q_blk, k_blk)
            mask = _block_mask(static, q_start, k_start, seg, window)
            p = jnp.where(mask, jnp.exp(s - lse_blk[..., None]), 0.0)  # [B, K, G, Bq, Bk]
            dp = jnp.einsum("bqkgh,bskh->bkgqs", do_blk, v_blk,
                            preferred_element_type=jnp.float32)
            ds = p * (dp - delta_blk[..., None])
            if tanh is not None:
                ds = ds * (1.0 - tanh * tanh)
            ds = ds.astype(q.dtype)
            dq = dq + jnp.einsum("bkgqs,bskh->bqkgh", ds, k_blk,
                                 preferred_element_type=jnp.float32)
            dk_blk = jnp.einsum("bkgqs,bqkgh->bskh", ds, q_blk,
                                preferred_element_type=jnp.float32)
            dv_blk = jnp.einsum("bkgqs,bqkgh->bskh", p.astype(v.dtype), do_blk,
                                preferred_element_type=jnp.float32)
            return dq, _add_block(dk, dk_blk, k_start), _add_block(dv, dv_blk, k_start)

        dq0 = jnp.zeros((b, bs, kv, g, h), jnp.float32)
        dq, dk, dv = lax.fori_loop(lo[qi], hi[qi], key_block, (dq0, dk, dv))
        dq = (dq * static.scale).astype(q.dtype)  # d(q * scale) / dq
        dq_all = lax.dynamic_update_slice_in_dim(dq_all, dq, q_start, 1)
        return dq_all, dk, dv

    zeros = jnp.zeros((b, t_pad, kv, h), jnp.float32)
    init = (jnp.zeros(q.shape, q.dtype), zeros, zeros)
    dq, dk, dv = lax.fori_loop(0, t_pad // bs, query_block, init)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


def _add_block(acc_bthk, blk, start):
    return lax.dynamic_update_slice_in_dim(
        acc_bthk, lax.dynamic_slice_in_dim(acc_bthk, start, blk.shape[1], 1) + blk, start, 1)


_flash.defvjp(_flash_forward, _flash_backward)
