"""Vectorised per-row sampling: temperature, top-k, top-p, per-request keys, behaviour logprobs.

Every row carries its own parameters as arrays, so one jitted call samples a whole batch of
requests with different settings. A row's randomness is `fold_in(fold_in(key0, seed),
position)`: it depends on the request's seed and the absolute position of the sampled token
only, never on which other requests share the batch or on which slot the request sits in.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["RowSampling", "sample_tokens"]

_BASE_KEY_SEED = 0x5EED


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
        base = jax.random.key(_BASE_KEY_SEED)
        keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.fold_in(base, s), p))(
            params.seed, positions_b.astype(jnp.uint32)
        )
        shape = (logits_bv.shape[-1],)
        gumbel = jax.vmap(lambda k: jax.random.gumbel(k, shape, jnp.float32))(keys)
        return jnp.argmax(masked_bv + gumbel, axis=-1)

    # An all-greedy batch draws no noise (the Gumbel draw costs as much as the softmax).
    sampled = jax.lax.cond(jnp.all(greedy_b), lambda m: greedy, draw, masked)
    tokens = jnp.where(greedy_b, greedy, sampled).astype(jnp.int32)
    logprobs = jnp.take_along_axis(logp_bv, tokens[:, None], axis=-1)[:, 0]
    return tokens, logprobs
