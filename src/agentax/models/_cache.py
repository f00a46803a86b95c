"""The generation engine's KV cache: its layout (`KVCache`, ring lengths of sliding-window
layers), allocation and size, and the position helpers of the cached forward pass (see
`agentax.models._transformer`)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentax.models._config import ModelConfig

__all__ = ["KVCache", "cache_lengths", "init_cache", "kv_cache_bytes", "positions_from_segments"]


class KVCache(NamedTuple):
    """Per-layer key/value buffers: `k[l]`, `v[l]` are [S, K, T_max, H].

    A sliding-window layer held as a ring is [S, K, R, H] (R < T_max; position p sits at
    index p mod R).

    Head-major: attention reads `[S, K, :L, H]`, a contiguous prefix per head, so neither the
    write nor the read needs a transposed copy of the cache (the [S, T, K, H] layout made XLA
    copy the whole cache four times per decode step on CPU)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def num_slots(self) -> int:
        return int(self.k[0].shape[0])

    @property
    def max_seq_len(self) -> int:
        """Positions a slot holds (ring layers hold fewer; at least one layer holds all)."""
        return max(int(c.shape[2]) for c in self.k)

    def fresh(self, steps: int) -> "KVCache":
        """Zeroed per-layer [S, K, steps, H] buffers for the K/V of one fused decode call."""
        return KVCache(*(tuple(jnp.zeros((*c.shape[:2], steps, c.shape[3]), c.dtype) for c in part)
                         for part in (self.k, self.v)))

    def write_fresh(self, fresh: "KVCache", start_b: jax.Array, counts_b: jax.Array) -> "KVCache":
        """Writes the first `counts_b[s]` steps of `fresh` into slot s at start_b[s] onwards."""
        steps = fresh.k[0].shape[2]
        t_max = self.max_seq_len
        j = jnp.arange(steps)[None, :]
        positions = jnp.where(j < counts_b[:, None], start_b[:, None] + j, t_max)  # [S, F]
        rows = jnp.arange(self.num_slots)[:, None]

        def write(c, f):  # c[rows, :, index] is [S, F, K, H]
            index = _cache_index(positions, c.shape[2], t_max)
            return c.at[rows, :, index].set(f.transpose(0, 2, 1, 3), mode="drop")

        return KVCache(tuple(map(write, self.k, fresh.k)), tuple(map(write, self.v, fresh.v)))


def cache_lengths(config: ModelConfig, max_seq_len: int,
                  max_tokens_per_call: int | None = None) -> tuple[int, ...]:
    """Positions each layer's cache holds: `max_seq_len`, or for a sliding-window layer with
    `max_tokens_per_call` given, a ring of window + max_tokens_per_call - 1 when that is
    shorter (and some layer still holds the whole slot, which fixes its length)."""
    full = [max_seq_len] * config.num_layers
    if max_tokens_per_call is None:
        return tuple(full)
    if max_tokens_per_call < 1:
        raise ValueError(f"max_tokens_per_call must be >= 1, got {max_tokens_per_call}")
    windows = [config.layer_window(i) for i in range(config.num_layers)]
    ring = [min(max_seq_len, w + max_tokens_per_call - 1) if w else max_seq_len for w in windows]
    return tuple(ring) if max_seq_len in ring else tuple(full)


def init_cache(config: ModelConfig, num_slots: int, max_seq_len: int, dtype=None,
               max_tokens_per_call: int | None = None) -> KVCache:
    """A zeroed KV cache for `num_slots` sequences of up to `max_seq_len` tokens.

    With `max_tokens_per_call` (the most tokens one `forward_cached` call feeds a row, and the
    most steps of a fused decode call), sliding-window layers hold rings (`cache_lengths`).
    """
    dtype = jnp.dtype(dtype or config.dtype)
    shapes = [(num_slots, config.num_kv_heads, n, config.head_dim)
              for n in cache_lengths(config, max_seq_len, max_tokens_per_call)]
    return KVCache(
        k=tuple(jnp.zeros(shape, dtype) for shape in shapes),
        v=tuple(jnp.zeros(shape, dtype) for shape in shapes),
    )


def kv_cache_bytes(config: ModelConfig, num_slots: int, max_seq_len: int, dtype=None,
                   max_tokens_per_call: int | None = None) -> int:
    """Bytes `init_cache` would allocate."""
    itemsize = jnp.dtype(dtype or config.dtype).itemsize
    positions = sum(cache_lengths(config, max_seq_len, max_tokens_per_call))
    return 2 * num_slots * positions * config.num_kv_heads * config.head_dim * itemsize


def _cache_index(positions, length: int, t_max: int):
    """Where positions sit in a layer cache of `length` (a ring when < t_max); positions >=
    t_max map past the end, so a `mode="drop"` write skips them."""
    if length == t_max:
        return positions
    return jnp.where(positions < t_max, positions % length, length)


def _ring_positions(length_b, ring: int):
    """[B, R]: the position ring index j holds once a row holds positions [0, length_b):
    the latest p < length_b with p = j mod R (negative: nothing written there yet)."""
    last = length_b[:, None] - 1
    return last - (last - jnp.arange(ring)[None, :]) % ring


def positions_from_segments(segment_ids_bt: jax.Array) -> jax.Array:
    """Positions that restart at 0 at each new segment of a packed row (padding = segment 0)."""
    b, t = segment_ids_bt.shape
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    starts = jnp.concatenate(
        [jnp.ones((b, 1), bool), segment_ids_bt[:, 1:] != segment_ids_bt[:, :-1]], axis=1
    )
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return idx - start_idx
