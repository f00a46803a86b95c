"""Vectorised per-row sampling: temperature, top-k, top-p, per-request keys, behaviour logprobs.

Every row carries its own parameters as arrays, so one jitted call samples a whole batch of
requests with different settings. A row's randomness is a counter-based hash of (seed,
position, vocabulary index): it depends on the request's seed and the absolute position of
the sampled token only, never on which other requests share the batch or on which slot the
request sits in.

The noise is a 32-bit integer hash (Wellons' `lowbias32`, applied twice per stage), not
`jax.random`'s threefry: every decode and prefill kernel samples, and threefry's unrolled
rounds cost ~0.27 s of XLA compile per kernel on CPU (0.33 against 0.06 s for the draw alone)
and ~1.5x the draw's run time; sampling needs uniform, independent-looking noise, not a
cryptographic generator (tests/engine/test_sampling.py checks the distributions).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["RowSampling", "sample_tokens"]

_BASE_KEY_SEED = 0x5EED
_GOLDEN = 0x9E3779B9  # odd multipliers: distinct counters stay distinct before mixing
_INDEX_MUL = 0x85EBCA6B


def _mix(x: jax.Array) -> jax.Array:
    """`lowbias32`: a bijective uint32 hash with strong avalanche (wrapping multiplies)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _gumbel(seed_b: jax.Array, positions_b: jax.Array, vocab: int) -> jax.Array:
    """[B, V] float32 Gumbel noise keyed by each row's (seed, position) and the token index."""
    seed = _mix(_mix(seed_b.astype(jnp.uint32) ^ jnp.uint32(_BASE_KEY_SEED)))
    row = _mix(_mix(seed + positions_b.astype(jnp.uint32) * jnp.uint32(_GOLDEN)))
    index = jnp.arange(vocab, dtype=jnp.uint32) * jnp.uint32(_INDEX_MUL)
    bits = _mix(_mix(row[:, None] ^ index[None, :]))
    uniform = ((bits >> 8).astype(jnp.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1)
    return -jnp.log(-jnp.log(uniform))


class RowSampling(NamedTuple):
    """Sampling parameters of B rows, as arrays."""

    temperature: jax.Array  # [B] float32, 0 = greedy
    top_k: jax.Array  # [B] int32, 0 = off
    top_p: jax.Array  # [B] float32, 1 = off
    seed: jax.Array  # [B] uint32


def _truncate(scaled_bv: jax.Array, top_k_b: jax.Array, top_p_b: jax.Array) -> jax.Array:
    """Masks (to -inf) tokens outside top-k, then outside the top-p nucleus of what is left."""
    v = scaled_bv.shape[-1]
    sorted_bv = -jnp.sort(-scaled_bv, axis=-1)  # descending
    rank = jnp.arange(v)[None, :]
    k_b = jnp.where(top_k_b > 0, jnp.minimum(top_k_b, v), v)
    in_k = rank < k_b[:, None]
    probs = jax.nn.softmax(jnp.where(in_k, sorted_bv, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # exclusive cumulative mass
    keep = in_k & (mass_before < top_p_b[:, None])  # rank 0 is always kept
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)
    threshold = jnp.take_along_axis(sorted_bv, (n_keep - 1)[:, None], axis=-1)  # [B, 1]
    return jnp.where(scaled_bv >= threshold, scaled_bv, -jnp.inf)


def sample_tokens(
    logits_bv: jax.Array, params: RowSampling, positions_b: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Samples one token per row and returns its behaviour logprob.

    The logprob is `log_softmax(logits / temperature)` at the sampled token (temperature 1
    for greedy rows), taken BEFORE top-k / top-p truncation. The trainer recomputes the
    logprob of these tokens under the same temperature-scaled distribution to form importance
    ratios; truncation is a sampling device, not part of the policy, so the logprob must not
    depend on it (a truncated logprob would make every ratio drift by the truncated mass).

    Args:
      logits_bv: [B, V] float32 logits.
      params: per-row sampling parameters.
      positions_b: [B] absolute position of the token being sampled (keys the randomness).

    Returns:
      (tokens [B] int32, logprobs [B] float32).
    """
    logits_bv = logits_bv.astype(jnp.float32)
    greedy_b = params.temperature <= 0.0
    temp_b = jnp.where(greedy_b, 1.0, params.temperature)
    scaled = logits_bv / temp_b[:, None]
    logp_bv = jax.nn.log_softmax(scaled, axis=-1)

    needs_truncation = jnp.any(
        ~greedy_b & ((params.top_k > 0) | (params.top_p < 1.0))
    )
    masked = jax.lax.cond(
        needs_truncation,
        lambda s: _truncate(s, params.top_k, params.top_p),
        lambda s: s,
        scaled,
    )
    greedy = jnp.argmax(logits_bv, axis=-1)

    def draw(masked_bv):
        noise = _gumbel(params.seed, positions_b, masked_bv.shape[-1])
        return jnp.argmax(masked_bv + noise, axis=-1)

    # An all-greedy batch draws no noise (the Gumbel draw costs as much as the softmax).
    sampled = jax.lax.cond(jnp.all(greedy_b), lambda m: greedy, draw, masked)
    tokens = jnp.where(greedy_b, greedy, sampled).astype(jnp.int32)
    logprobs = jnp.take_along_axis(logp_bv, tokens[:, None], axis=-1)[:, 0]
    return tokens, logprobs
