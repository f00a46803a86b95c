"""Value-head loss (clipped, PPO), token entropy bonus, and token log-prob gathering."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentax.algos._masked import aggregate_loss, masked_mean, safe_div


def value_loss(*, values_bt: jax.Array, old_values_bt: jax.Array, returns_bt: jax.Array,
               loss_mask_bt: jax.Array, clip_eps: float | None = 0.2,
               agg_mode: str = "token-mean", agg_norm: float | None = None,
               global_count=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped value loss of PPO (Schulman et al. 2017; as in OpenAI baselines / verl).

    v_clip = old_v + clip(v - old_v, -clip_eps, clip_eps)
    l = 0.5 * max((v - R)^2, (v_clip - R)^2);   clip_eps=None gives plain 0.5 * (v - R)^2.

    Args:
      values_bt: [B, T] current value predictions (with gradient).
      old_values_bt: [B, T] predictions recorded when advantages were computed.
      returns_bt: [B, T] targets (from gae_advantages).
      loss_mask_bt: [B, T] 1 on trained tokens.
    Returns:
      (loss, {"vf_loss", "vf_clip_frac", "value_mean", "explained_variance"}).
    """
    mask = jnp.asarray(loss_mask_bt, jnp.float32) > 0
    ret = jax.lax.stop_gradient(jnp.where(mask, returns_bt, 0.0))
    v = jnp.where(mask, values_bt, 0.0)
    err = jnp.square(v - ret)
    if clip_eps is None:
        loss_bt = 0.5 * err
        clipped = jnp.zeros(mask.shape, bool)
    else:
        old = jax.lax.stop_gradient(jnp.where(mask, old_values_bt, 0.0))
        v_clip = old + jnp.clip(v - old, -clip_eps, clip_eps)
        err_clip = jnp.square(v_clip - ret)
        loss_bt = 0.5 * jnp.maximum(err, err_clip)
        clipped = err_clip > err
    loss = aggregate_loss(loss_bt, mask, mode=agg_mode, norm=agg_norm,
                          global_count=global_count)
    var_ret = masked_mean(jnp.square(ret - masked_mean(ret, mask)), mask)
    resid = ret - v
    var_res = masked_mean(jnp.square(resid - masked_mean(resid, mask)), mask)
    metrics = {
        "vf_loss": loss,
        "vf_clip_frac": masked_mean(clipped.astype(jnp.float32), mask),
        "value_mean": masked_mean(v, mask),
        "explained_variance": jnp.where(var_ret > 0, 1.0 - safe_div(var_res, var_ret), 0.0),
    }
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def token_entropy(logits_btv: jax.Array) -> jax.Array:
    """Entropy of the categorical over V at each position: [B, T, V] -> [B, T] float32.

    Logits must already include the sampling temperature. -inf logits (masked vocabulary)
    are allowed and contribute 0.
    """
    logits = jnp.asarray(logits_btv, jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.where(jnp.isfinite(logp), logp, 0.0)
    p = jnp.exp(logp) * jnp.isfinite(logits)
    return -jnp.sum(p * logp, axis=-1)


def entropy_bonus(*, logits_btv: jax.Array | None = None, entropy_bt: jax.Array | None = None,
                  loss_mask_bt: jax.Array, coef: float, agg_mode: str = "token-mean",
                  agg_norm: float | None = None,
                  global_count=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Entropy bonus as a loss term: -coef * aggregated token entropy over trained tokens.

    (Mnih et al. 2016 / PPO's c2 * S term.) Takes the logits [B, T, V] or the token entropy
    [B, T] already computed (e.g. by `chunked_token_stats`), exactly one of them.
    Returns (loss, {"entropy": aggregated entropy}).
    """
    if (logits_btv is None) == (entropy_bt is None):
        raise ValueError("entropy_bonus takes exactly one of logits_btv and entropy_bt")
    if entropy_bt is None:
        entropy_bt = token_entropy(logits_btv)
    ent = aggregate_loss(entropy_bt, loss_mask_bt, mode=agg_mode, norm=agg_norm,
                         global_count=global_count)
    return -coef * ent, {"entropy": jax.lax.stop_gradient(ent)}


def gather_logprobs(logits_btv: jax.Array, token_ids_bt: jax.Array) -> jax.Array:
    """log softmax(logits)[b, t, token_ids[b, t]] -> [B, T] float32 (the current log-probs).

    Logits at position t must be the ones that predicted token_ids[:, t] (shift beforehand).
    """
    logp_btv = jax.nn.log_softmax(jnp.asarray(logits_btv, jnp.float32), axis=-1)
    ids = jnp.asarray(token_ids_bt, jnp.int32)[..., None]
    return jnp.take_along_axis(logp_btv, ids, axis=-1)[..., 0]
