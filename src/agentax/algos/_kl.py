"""KL divergence to a reference policy: per-token estimators, a loss term, KL-in-reward.

Estimators follow J. Schulman, "Approximating KL Divergence" (2020). With samples y ~ pi and
log r = log pi_ref(y) - log pi(y), each estimates KL(pi || pi_ref):
  k1 = -log r                      (unbiased, high variance, can be negative)
  k2 = 0.5 * (log r)^2             ("squared"; biased, low variance)
  k3 = exp(log r) - 1 - log r      (unbiased, low variance, always >= 0)
Departure: log r is clamped to [-20, 20] before the exponential in k3, so a token whose
reference probability underflows cannot turn the loss into inf; the gradient is zero past
the clamp.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentax.algos._masked import aggregate_loss, masked_max, masked_mean

KL_KINDS = ("k1", "k2", "k3", "squared")
_LOG_RATIO_CLAMP = 20.0


def kl_estimate(logp_bt: jax.Array, ref_logp_bt: jax.Array, *, kind: str = "k3") -> jax.Array:
    """Per-token KL(pi || pi_ref) estimate, same shape as the inputs (no masking).

    Args:
      logp_bt: [B, T] log-probs of the sampled tokens under the policy (current for a loss
        term with gradient; behaviour or proximal for KL-in-reward).
      ref_logp_bt: [B, T] log-probs of the same tokens under the frozen reference policy.
      kind: "k1", "k2" (alias "squared") or "k3".
    """
    log_r = ref_logp_bt - logp_bt
    if kind == "k1":
        return -log_r
    if kind in ("k2", "squared"):
        return 0.5 * jnp.square(log_r)
    if kind == "k3":
        log_r = jnp.clip(log_r, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return jnp.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {KL_KINDS}")


def kl_loss(*, logp_bt: jax.Array, ref_logp_bt: jax.Array, loss_mask_bt: jax.Array,
            kind: str = "k3", agg_mode: str = "token-mean", agg_norm: float | None = None,
            global_count=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """KL penalty as a loss term (GRPO, Shao et al. 2024 "DeepSeekMath", uses k3).

    The caller multiplies the returned loss by its coefficient (beta). Gradient flows
    through `logp_bt` (the current policy) only; the reference is treated as constant.

    Returns:
      (loss, {"kl": loss value, "kl_max": max per-token estimate over trained tokens}).
    """
    kl_bt = kl_estimate(logp_bt, jax.lax.stop_gradient(ref_logp_bt), kind=kind)
    loss = aggregate_loss(kl_bt, loss_mask_bt, mode=agg_mode, norm=agg_norm,
                          global_count=global_count)
    return loss, {"kl": loss, "kl_max": masked_max(kl_bt, loss_mask_bt)}


def kl_in_reward(*, token_rewards_bt: jax.Array, logp_bt: jax.Array, ref_logp_bt: jax.Array,
                 loss_mask_bt: jax.Array, beta: float, kind: str = "k1"
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Subtract beta * KL from per-token rewards (InstructGPT / REINFORCE++ / PPO-RLHF style).

    Use the behaviour (or proximal) log-probs here, not the current ones: the shaped reward is
    a constant target, so gradients are stopped. Masked tokens get no penalty.

    Args:
      token_rewards_bt: [B, T] rewards per token (see `place_sequence_reward`).
      logp_bt, ref_logp_bt: [B, T] sampled-token log-probs under policy and reference.
      loss_mask_bt: [B, T] 1 on trained tokens.
      beta: KL coefficient.
      kind: KL estimator ("k1" is the classic choice).

    Returns:
      (shaped token rewards [B, T], {"kl_reward_mean": mean per-token KL over the mask}).
    """
    kl_bt = jax.lax.stop_gradient(kl_estimate(logp_bt, ref_logp_bt, kind=kind))
    mask = jnp.asarray(loss_mask_bt, jnp.float32) > 0
    kl_bt = jnp.where(mask, kl_bt, 0.0)
    return token_rewards_bt - beta * kl_bt, {"kl_reward_mean": masked_mean(kl_bt, mask)}
