"""The generation engine's KV cache — a pool of pages — and the cached forward over it, with
attention whose cost follows each row's own length (ragged), and no static attention span.

The cache is, per layer, a pool of pages [P, K, PAGE, H] for k and for v (`KVCache`,
`init_page_pool`; `StackedKV` holds every layer in one array), and a page table [S, N]
listing each sequence's pages in order (position p of a row sits at page
`table[row, p // PAGE]`, offset `p % PAGE`). It is the engine's only KV layout: a page holds
any 16 positions, so sliding-window layers need no ring (their attention skips the pages
before the window).

* `paged_forward` (prefill): per layer, the chunk's K/V are written to their pages first;
  then each query attends over its row's pages in blocks of `PREFILL_BLOCK_PAGES` pages,
  with an online softmax, for as many blocks as the longest row of the call holds: the trip
  count is data, not a shape, so one compiled kernel serves every length.
* `paged_decode_step` (one step of the fused decode loop): the (row, page) pairs that active
  rows must read are enumerated on the device and visited `DECODE_BLOCK_PAIRS` at a time,
  with a per-row online softmax (segment max / sum over the pairs' rows). The work is the
  sum of the active rows' pages: a 4,096-token straggler costs its own 256 pages, not 256
  pages for every slot; idle slots read nothing. The K/V of the call's own steps come from a
  small `fresh` buffer (written to their pages once, after the call) and seed the softmax.

Both are the FlashAttention recurrence (Dao, 2023, https://arxiv.org/abs/2307.08691) over
pages instead of contiguous blocks, and the ragged (variable-length) batching of vLLM's
PagedAttention (Kwon et al., 2023, https://arxiv.org/abs/2309.06180), written with `lax`
loops in pure JAX (the Pallas kernels of jax.experimental are not used here).

Both also take a `StackedTransformer` with a `StackedKV` pool ([L, P, K, PAGE, H]) and then
run the layers as one `lax.scan` (`_stacked.py`): a layer reads and writes the pool at its
index, and a traced per-layer window replaces the static one when the layers' differ.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from agentax.models._config import ModelConfig
from agentax.models._stacked import StackedKV, StackedTransformer

__all__ = ["PAGE", "KVCache", "init_page_pool", "page_pool_bytes", "paged_forward",
           "paged_decode_step", "scatter_pages"]

PAGE = 16
"""Positions per page."""


class KVCache(NamedTuple):
    """Per-layer page pools: `k[l]`, `v[l]` are [P, K, PAGE, H] (head-major within a page).
    Also the per-layer [S, K, F, H] buffers of a fused decode call's own K/V."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


def init_page_pool(config: ModelConfig, num_pages: int, dtype=None) -> KVCache:
    """A zeroed pool of `num_pages` pages per layer (dtype: the model's compute dtype)."""
    dtype = jnp.dtype(dtype or config.dtype)
    shape = (num_pages, config.num_kv_heads, PAGE, config.head_dim)
    return KVCache(tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                   tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)))


def page_pool_bytes(config: ModelConfig, num_pages: int, dtype=None) -> int:
    """Bytes `init_page_pool` would allocate (k and v, every layer)."""
    itemsize = jnp.dtype(dtype or config.dtype).itemsize
    return (2 * config.num_layers * num_pages * PAGE * config.num_kv_heads * config.head_dim
            * itemsize)

PREFILL_BLOCK_PAGES = 8
"""Pages of a row one prefill attention iteration reads (128 positions)."""

DECODE_BLOCK_PAIRS = 64
"""(row, page) pairs one decode attention iteration reads (1,024 positions over all rows).
On the CPU (tiny model, 32 slots) 32, 64 and 128 cost within 15 % of each other; larger
blocks waste more on a light load's last block."""


def scatter_pages(pool: jax.Array, table_rn: jax.Array, positions_rt: jax.Array,
                  values_rtkh: jax.Array, t_max: int, layer=None) -> jax.Array:
    """Writes values [R, T, K, H] at positions [R, T] of each row's pages of `pool` [P, K,
    PAGE, H] (or of layer `layer`'s pages of a stacked pool [L, P, K, PAGE, H]); positions
    >= t_max write nothing."""
    lead = () if layer is None else (layer,)
    index = jnp.minimum(positions_rt // PAGE, table_rn.shape[1] - 1)
    page = jnp.take_along_axis(table_rn, index, axis=1)
    page = jnp.where(positions_rt < t_max, page, pool.shape[-4])  # out of range: dropped
    return pool.at[(*lead, page, slice(None), positions_rt % PAGE)].set(
        values_rtkh.astype(pool.dtype), mode="drop")


def _pages(pool, layer, pages):
    """pool[pages] ([..., K, PAGE, H]), of layer `layer` of a stacked pool."""
    return pool[pages] if layer is None else pool[layer, pages]


def _window_ok(attn, q_pos, k_pos, window=None):
    """Causal and within the layer's sliding window: `attn.window` (static), or `window`
    (traced, one per layer under the engine's scan; 0 = none) when given."""
    ok = k_pos <= q_pos
    if window is not None:
        return ok & ((window <= 0) | (k_pos > q_pos - window))
    if attn.window is not None:
        ok &= k_pos > q_pos - attn.window
    return ok


def _first_visible(attn, q_pos, window=None):
    """The earliest key position a query at q_pos sees (0 without a window)."""
    if window is not None:
        return jnp.where(window > 0, jnp.maximum(q_pos - window + 1, 0), 0)
    if attn.window is not None:
        return jnp.maximum(q_pos - attn.window + 1, 0)
    return jnp.zeros_like(q_pos)


def _capped(attn, scores):
    return scores if attn.softcap is None else jnp.tanh(scores / attn.softcap) * attn.softcap


def _online(m, l, acc, scores, mask, values_fn):
    """One online-softmax update of (max, sum, weighted values) by a block of `scores`
    (-inf where `mask` is False); `values_fn(p)` is the block's p @ V in acc's layout."""
    scores = jnp.where(mask, scores, -jnp.inf)
    m_new = jnp.maximum(m, scores.max(axis=-1))
    shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row that saw nothing: exp gives 0
    p = jnp.exp(scores - shift[..., None])
    alpha = jnp.exp(m - shift)
    return m_new, alpha * l + p.sum(axis=-1), alpha[..., None] * acc + values_fn(p)


# ------------------------------------------------------------------------------ prefill


def _prefill_attention(attn, q_rtnh, pool_k, pool_v, table_rn, positions_rt, t_max, layer=None,
                       window=None):
    """[R, T, N, H]: each query over its row's positions <= its own (written before); the
    pools are layer `layer`'s of stacked pools when it is given."""
    r, t, n, h = q_rtnh.shape
    kv = pool_k.shape[-3]
    q = (q_rtnh * jnp.asarray(attn.scale, q_rtnh.dtype)).reshape(r, t, kv, n // kv, h)
    bp = PREFILL_BLOCK_PAGES
    table = jnp.pad(table_rn, ((0, 0), (0, -table_rn.shape[1] % bp)))
    real = positions_rt < t_max
    end = jnp.max(jnp.where(real, positions_rt + 1, 0))  # keys the longest row reads
    first = 0  # the earliest key any real query sees
    if attn.window is not None or window is not None:
        first = _first_visible(attn, jnp.min(jnp.where(real, positions_rt, t_max)), window)
    q_pos = positions_rt[:, None, None, :, None]  # [R, 1, 1, T, 1]

    def block(b, carry):
        pages = lax.dynamic_slice_in_dim(table, b * bp, bp, axis=1)  # [R, bp]
        k_blk, v_blk = _pages(pool_k, layer, pages), _pages(pool_v, layer, pages)
        # [R, bp, K, PAGE, H]
        s = jnp.einsum("rtkgh,rbkih->rkgtbi", q, k_blk, preferred_element_type=jnp.float32)
        s = _capped(attn, s.reshape(*s.shape[:4], bp * PAGE))  # [R, K, G, T, bp * PAGE]
        k_pos = b * bp * PAGE + jnp.arange(bp * PAGE)
        mask = _window_ok(attn, q_pos, k_pos, window) & real[:, None, None, :, None]

        def values(p):
            p = p.reshape(*p.shape[:4], bp, PAGE).astype(v_blk.dtype)
            return jnp.einsum("rkgtbi,rbkih->rkgth", p, v_blk,
                              preferred_element_type=jnp.float32)

        return _online(*carry, s, mask, values)

    g = n // kv
    init = (jnp.full((r, kv, g, t), -jnp.inf, jnp.float32), jnp.zeros((r, kv, g, t), jnp.float32),
            jnp.zeros((r, kv, g, t, h), jnp.float32))
    span = bp * PAGE
    _, l, acc = lax.fori_loop(first // span, (end + span - 1) // span, block, init)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # [R, K, G, T, H]
    return out.transpose(0, 3, 1, 2, 4).reshape(r, t, n, h).astype(pool_v.dtype)


def paged_forward(model, tokens_rt, positions_rt, pool, table_rn, t_max: int, *,
                  last_only: bool):
    """Prefill (or any cached forward) of `model` over a paged `pool` (a KVCache of page
    pools, or a `StackedKV` for a `StackedTransformer`: layers scanned, and with `last_only`
    the last layer runs for every column); row r uses the pages `table_rn[r]`. Positions >=
    t_max (padding) write nothing.

    Returns (logits [R, V] of each row's last column with `last_only`, else [R, T, V];
    the updated pool)."""
    x = model.embed_tokens(tokens_rt)

    def layer(block, x, pk, pv, i=None, inv_freq=None, window=None, last=False):
        attn = block.attn
        q, k, v = attn.qkv(block.attn_norm(x), positions_rt, inv_freq)
        pk = scatter_pages(pk, table_rn, positions_rt, k, t_max, i)
        pv = scatter_pages(pv, table_rn, positions_rt, v, t_max, i)
        out = _prefill_attention(attn, q, pk, pv, table_rn, positions_rt, t_max, i, window)
        r, t = positions_rt.shape
        if last:  # only the last token goes on: [R, 1, D]
            out, x, t = out[:, -1:], x[:, -1:], 1
        return block._finish(x, attn.o_proj(out.reshape(r, t, -1))), pk, pv

    if isinstance(model, StackedTransformer):  # one scanned layer; every column runs it
        def body(block, i, inv_freq, window, x, kv):
            x, pk, pv = layer(block, x, *kv, i, inv_freq, window)
            return x, (pk, pv)

        x, (k, v) = model.scan(body, x, (pool.k, pool.v))
        if last_only:
            x = x[:, -1]
        return model.logits(model.final_norm(x)), StackedKV(k, v)
    new_k, new_v = [], []
    last = len(model.layers) - 1
    for i, (block, pk, pv) in enumerate(zip(model.layers, pool.k, pool.v)):
        x, pk, pv = layer(block, x, pk, pv, last=last_only and i == last)
        new_k.append(pk)
        new_v.append(pv)
    if last_only:
        x = x[:, 0]
    return model.logits(model.final_norm(x)), type(pool)(tuple(new_k), tuple(new_v))


# ------------------------------------------------------------------------------ decode


def _decode_attention(attn, q_snh, pool_k, pool_v, table_sn, kv_len_s, q_pos_s, k_new, v_new,
                      mask_new_sf, layer=None, window=None):
    """[S, N * H]: each row's one query over its pages (positions < kv_len_s) and over the
    call's own steps (`k_new`/`v_new` [S, K, F, H] where `mask_new_sf`); the pools are layer
    `layer`'s of stacked pools when it is given."""
    s, n, h = q_snh.shape
    kv = pool_k.shape[-3]
    g = n // kv
    q = (q_snh * jnp.asarray(attn.scale, q_snh.dtype)).reshape(s, kv, g, h)
    # Seeded by the call's own steps (the current token is always among them).
    s_new = _capped(attn, jnp.einsum("skgh,skfh->skgf", q, k_new,
                                     preferred_element_type=jnp.float32))
    init = (jnp.full((s, kv, g), -jnp.inf, jnp.float32), jnp.zeros((s, kv, g), jnp.float32),
            jnp.zeros((s, kv, g, h), jnp.float32))
    carry = _online(*init, s_new, mask_new_sf[:, None, None, :],
                    lambda p: jnp.einsum("skgf,skfh->skgh", p.astype(v_new.dtype), v_new,
                                         preferred_element_type=jnp.float32))
    hi = (kv_len_s + PAGE - 1) // PAGE
    lo = jnp.zeros_like(hi)
    if attn.window is not None or window is not None:
        lo = jnp.clip(_first_visible(attn, q_pos_s, window) // PAGE, 0, hi)
    count = hi - lo  # pages each row reads
    end = jnp.cumsum(count)
    start = end - count
    bp = DECODE_BLOCK_PAIRS

    def block(b, carry):
        m, l, acc = carry
        pair = b * bp + jnp.arange(bp)
        row = jnp.minimum(jnp.searchsorted(end, pair, side="right"), s - 1)  # [bp], sorted
        j = lo[row] + pair - start[row]  # the pair's page index within its row
        page = table_sn[row, jnp.clip(j, 0, table_sn.shape[1] - 1)]
        k_blk, v_blk = _pages(pool_k, layer, page), _pages(pool_v, layer, page)
        # [bp, K, PAGE, H]
        sc = _capped(attn, jnp.einsum("bkgh,bkih->bkgi", q[row], k_blk,
                                      preferred_element_type=jnp.float32))
        k_pos = j[:, None] * PAGE + jnp.arange(PAGE)  # [bp, PAGE]
        mask = ((pair < end[-1])[:, None] & (k_pos < kv_len_s[row][:, None])
                & _window_ok(attn, q_pos_s[row][:, None], k_pos, window))
        sc = jnp.where(mask[:, None, None, :], sc, -jnp.inf)
        m_new = jnp.maximum(m, jax.ops.segment_max(sc.max(-1), row, s, indices_are_sorted=True))
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(sc - shift[row][..., None])
        pv = jnp.einsum("bkgi,bkih->bkgh", p.astype(v_blk.dtype), v_blk,
                        preferred_element_type=jnp.float32)
        alpha = jnp.exp(m - shift)
        return (m_new,
                alpha * l + jax.ops.segment_sum(p.sum(-1), row, s, indices_are_sorted=True),
                alpha[..., None] * acc + jax.ops.segment_sum(pv, row, s,
                                                             indices_are_sorted=True))

    _, l, acc = lax.fori_loop(0, (end[-1] + bp - 1) // bp, block, carry)
    return (acc / l[..., None]).astype(pool_v.dtype).reshape(s, n * h)


def paged_decode_step(model, tokens_s, positions_s, pool, table_sn, fresh, step, start_s,
                      active_s):
    """One step of a fused decode call over every slot, reading the paged `pool` (which holds
    each active slot's positions before start_s) and writing only `fresh`.

    Args:
      tokens_s: [S] the token each slot feeds, at positions_s (= start_s + step).
      pool: the page pools (a KVCache; a `StackedKV` for a `StackedTransformer`), only read.
      table_sn: [S, N] each slot's pages.
      fresh: per-layer [S, K, F, H] K/V of this call's steps; step j sits at index j (a
        `StackedKV` [L, S, K, F, H] with a stacked pool).
      step: int32 scalar, this step's index in the call.
      start_s: [S] the position of each slot's first token in this call.
      active_s: [S] bool; idle slots read no page.

    Returns:
      (logits [S, V] float32, fresh with this step's K/V at index `step`).
    """
    x = model.embed_tokens(tokens_s[:, None])
    kv_len = jnp.where(active_s, start_s, 0)

    def layer(block, x, pk, pv, k_new, v_new, i=None, inv_freq=None, window=None):
        attn = block.attn
        q, k, v = attn.qkv(block.attn_norm(x), positions_s[:, None], inv_freq)
        k_new = lax.dynamic_update_slice(
            k_new, k.transpose(0, 2, 1, 3).astype(k_new.dtype), (0, 0, step, 0))
        v_new = lax.dynamic_update_slice(
            v_new, v.transpose(0, 2, 1, 3).astype(v_new.dtype), (0, 0, step, 0))
        j = jnp.arange(k_new.shape[2])[None, :]
        mask_new = (j <= step) & _window_ok(attn, positions_s[:, None], start_s[:, None] + j,
                                            window)
        out = _decode_attention(attn, q[:, 0], pk, pv, table_sn, kv_len, positions_s, k_new,
                                v_new, mask_new, i, window)
        return block._finish(x, attn.o_proj(out[:, None])), k_new, v_new

    if isinstance(model, StackedTransformer):  # pool and fresh [L, ...]: layer i's at i
        def body(block, i, inv_freq, window, x, kv):
            fk, fv = kv
            x, k_new, v_new = layer(block, x, pool.k, pool.v, fk[i], fv[i], i, inv_freq,
                                    window)
            return x, (fk.at[i].set(k_new), fv.at[i].set(v_new))

        x, (fk, fv) = model.scan(body, x, (fresh.k, fresh.v))
        return model.logits(model.final_norm(x))[:, 0], StackedKV(fk, fv)
    new_k, new_v = [], []
    for block, pk, pv, k_new, v_new in zip(model.layers, pool.k, pool.v, fresh.k, fresh.v):
        x, k_new, v_new = layer(block, x, pk, pv, k_new, v_new)
        new_k.append(k_new)
        new_v.append(v_new)
    return model.logits(model.final_norm(x))[:, 0], type(fresh)(tuple(new_k), tuple(new_v))
