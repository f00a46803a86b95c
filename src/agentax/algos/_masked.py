"""Masked reductions and loss aggregation shared by every estimator and loss.

Every reduction here is safe on fully masked input: an empty mask yields 0 (never NaN), and
a row with no trained tokens carries zero weight in every aggregation mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def _f32(x: jax.Array) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.float32)


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
    """num / den where den > 0, else 0 (no NaN, no inf; gradients stay finite)."""
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def masked_sum(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Sum of x over positions where mask != 0; masked positions may hold NaN/inf."""
    mask = _f32(mask)
    return jnp.sum(jnp.where(mask > 0, x * mask, 0.0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Mean of x over positions where mask != 0; 0 when the mask is empty."""
    return safe_div(masked_sum(x, mask, axis), jnp.sum(_f32(mask), axis=axis))


def masked_max(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Max of x over the mask (a scalar); 0 when the mask is empty."""
    mask = _f32(mask) > 0
    return jnp.where(jnp.any(mask), jnp.max(jnp.where(mask, x, -jnp.inf)), 0.0)


def masked_whiten(x: jax.Array, mask: jax.Array, *, eps: float = 1e-8,
                  shift_mean: bool = True) -> jax.Array:
    """(x - mean) / sqrt(var + eps) with mean and (population) variance over the mask.

    Masked positions come back as 0. Used by REINFORCE++ and optionally for PPO advantages.
    """
    mean = masked_mean(x, mask)
    var = masked_mean(jnp.square(x - mean), mask)
    out = (x - mean) if shift_mean else x
    return jnp.where(_f32(mask) > 0, out * jax.lax.rsqrt(var + eps), 0.0)


def aggregate_loss(loss_bt: jax.Array, loss_mask_bt: jax.Array, *,
                   mode: str = "token-mean", norm: float | None = None,
                   global_count: jax.Array | float | None = None) -> jax.Array:
    """Reduce a per-token loss [B, T] to a scalar.

    Modes (all ignore masked tokens; rows with no trained token have zero weight):
      * "token-mean": sum over all trained tokens / number of trained tokens (DAPO's
        token-level loss; long sequences weigh more).
      * "seq-mean-token-mean": mean over sequences of the per-sequence token mean (the
        original GRPO / GSPO form; every sequence weighs the same, which biases towards
        short correct and long wrong answers, see Dr. GRPO).
      * "seq-mean-token-sum": mean over sequences of the per-sequence token sum.
      * "seq-mean-token-sum-norm": sum over trained tokens / (num sequences * norm) where
        norm is a constant (default T, the padded length): Dr. GRPO's unbiased aggregation,
        e.g. norm = max generation length.

    Args:
      loss_bt: [B, T] per-token loss.
      loss_mask_bt: [B, T] 1 on trained tokens.
      mode: one of AGG_MODES (a static Python string).
      norm: constant normaliser for "seq-mean-token-sum-norm" (default T).
      global_count: replace the local denominator (trained tokens for "token-mean", trained
        sequences for the seq-* modes) by a count over the whole optimizer batch, so that
        gradient accumulation over micro-batches sums to the full-batch loss.

    Returns:
      scalar float32 loss; 0 when the mask is empty.
    """
    mask = _f32(loss_mask_bt)
    loss_bt = jnp.where(mask > 0, loss_bt * mask, 0.0)
    tok_count_b = jnp.sum(mask, axis=-1)  # [B]
    seq_valid_b = (tok_count_b > 0).astype(jnp.float32)
    if mode == "token-mean":
        den = jnp.sum(mask) if global_count is None else global_count
        return safe_div(jnp.sum(loss_bt), _f32(den))
    seq_den = jnp.sum(seq_valid_b) if global_count is None else _f32(global_count)
    if mode == "seq-mean-token-mean":
        seq_b = safe_div(jnp.sum(loss_bt, axis=-1), tok_count_b)
    elif mode == "seq-mean-token-sum":
        seq_b = jnp.sum(loss_bt, axis=-1)
    elif mode == "seq-mean-token-sum-norm":
        scale = float(loss_bt.shape[-1] if norm is None else norm)
        if scale <= 0:
            raise ValueError(f"norm for 'seq-mean-token-sum-norm' must be > 0, got {norm}")
        seq_b = jnp.sum(loss_bt, axis=-1) / scale
    else:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {AGG_MODES}")
    return safe_div(jnp.sum(seq_b * seq_valid_b), seq_den)
