"""Policy-gradient losses: PPO clipped surrogate (clip-higher, dual-clip, off-policy
correction) and GSPO, plus the truncated importance weight for stale tokens.

Three log-probabilities of the sampled tokens appear here; every argument says which:
  * behaviour  (`behaviour_logp_bt`): recorded by the engine when the token was sampled,
    under whatever (possibly stale) weights version generated it.
  * proximal   (`proximal_logp_bt`): the policy at the start of this update, recomputed by
    the trainer (the "old" policy of PPO). Equal to behaviour only when max_staleness = 0
    and engine and trainer numerics agree.
  * current    (`logp_bt`): the policy being optimised; the only one with a gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentax.algos._kl import kl_estimate
from agentax.algos._masked import aggregate_loss, masked_max, masked_mean, safe_div

OFF_POLICY_MODES = ("none", "tis", "decoupled")
_LOG_RATIO_CLAMP = 20.0


def _ratio(logp_bt, ref_bt, mask):
    """exp(logp - stop_grad(ref)) with the log-ratio clamped and zeroed on padding."""
    log_r = jnp.where(mask, logp_bt - jax.lax.stop_gradient(ref_bt), 0.0)
    log_r = jnp.clip(log_r, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return jnp.exp(log_r), log_r


def truncated_importance_weights(*, proximal_logp_bt: jax.Array, behaviour_logp_bt: jax.Array,
                                 loss_mask_bt: jax.Array, cap: float = 2.0
                                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Truncated importance sampling (TIS) weight w = min(pi_proximal / pi_behaviour, cap).

    Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
    (there the mismatch is sampler vs trainer numerics; here it also covers stale weights).
    The weight is a constant (no gradient) that multiplies the per-token policy loss.

    Returns:
      (w_bt [B, T], 0 on untrained tokens; metrics is_weight_mean / is_weight_max /
      is_truncated_frac / behaviour_kl (k3 estimate of KL(behaviour || proximal))).
    """
    mask = jnp.asarray(loss_mask_bt, jnp.float32) > 0
    raw, _ = _ratio(proximal_logp_bt, behaviour_logp_bt, mask)
    raw = jax.lax.stop_gradient(raw)
    w = jnp.where(mask, jnp.minimum(raw, cap), 0.0)
    metrics = {
        "is_weight_mean": masked_mean(w, mask),
        "is_weight_max": masked_max(raw, mask),
        "is_truncated_frac": masked_mean((raw > cap).astype(jnp.float32), mask),
        "behaviour_kl": masked_mean(
            kl_estimate(jax.lax.stop_gradient(behaviour_logp_bt),
                        jax.lax.stop_gradient(proximal_logp_bt), kind="k3"), mask),
    }
    return w, metrics


def _off_policy_weight(mode, proximal_logp_bt, behaviour_logp_bt, mask, is_cap):
    """(weight_bt, effective mask, metrics) for an off-policy correction mode."""
    if mode not in OFF_POLICY_MODES:
        raise ValueError(f"unknown off_policy mode {mode!r}; choose one of {OFF_POLICY_MODES}")
    if mode == "none":
        return jnp.ones(mask.shape, jnp.float32), mask, {}
    if behaviour_logp_bt is None:
        raise ValueError(f"off_policy={mode!r} needs behaviour_logp_bt (the engine's sampling "
                         "log-probs); pass it or set off_policy='none'")
    if mode == "tis":
        cap = 2.0 if is_cap is None else is_cap
        w, metrics = truncated_importance_weights(
            proximal_logp_bt=proximal_logp_bt, behaviour_logp_bt=behaviour_logp_bt,
            loss_mask_bt=mask, cap=cap)
        return w, mask, metrics
    # decoupled (AReaL): untruncated weight; tokens whose weight exceeds the cap are dropped.
    raw, _ = _ratio(proximal_logp_bt, behaviour_logp_bt, mask)
    raw = jax.lax.stop_gradient(raw)
    keep = mask if is_cap is None else mask & (raw <= is_cap)
    metrics = {
        "is_weight_mean": masked_mean(raw, mask),
        "is_weight_max": masked_max(raw, mask),
        "is_masked_frac": masked_mean((mask & ~keep).astype(jnp.float32), mask),
        "behaviour_kl": masked_mean(
            kl_estimate(jax.lax.stop_gradient(behaviour_logp_bt),
                        jax.lax.stop_gradient(proximal_logp_bt), kind="k3"), mask),
    }
    return jnp.where(keep, raw, 0.0), keep, metrics


def ppo_policy_loss(*, logp_bt: jax.Array, proximal_logp_bt: jax.Array,
                    advantages_bt: jax.Array, loss_mask_bt: jax.Array,
                    behaviour_logp_bt: jax.Array | None = None, clip_eps_low: float = 0.2,
                    clip_eps_high: float | None = None, dual_clip_c: float | None = None,
                    off_policy: str = "none", is_cap: float | None = None,
                    agg_mode: str = "token-mean", agg_norm: float | None = None,
                    global_count=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO clipped surrogate (Schulman et al. 2017) with the variants used for LLM RL.

    per token:  ratio = pi_current / pi_proximal
                l = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))
    * clip-higher (DAPO, Yu et al. 2025): `clip_eps_high` > `clip_eps_low` (e.g. 0.28 / 0.2);
      default clip_eps_high = clip_eps_low (symmetric PPO).
    * dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games"): for A < 0 the
      loss is capped at -dual_clip_c * A (c > 1, e.g. 3), bounding the push from a token whose
      ratio exploded.
    * off-policy correction for tokens sampled by stale weights (`off_policy`):
      - "none": proximal is the only "old" policy (on-policy, or staleness ignored).
      - "tis": l *= min(pi_proximal / pi_behaviour, is_cap) (truncated IS, default cap 2).
      - "decoupled": decoupled PPO (Hilton et al. 2022; Fu et al. 2025, "AReaL"): the clip is
        taken against the proximal policy and the behaviour-to-proximal weight
        pi_proximal / pi_behaviour multiplies the objective; with `is_cap`, tokens whose
        weight exceeds it are masked out (AReaL's behaviour-weight cap) instead of truncated.
    Departures: log-ratios are clamped to [-20, 20] before exp (zero gradient beyond);
    untrained tokens (and tokens dropped by the decoupled cap) carry no weight.

    Args:
      logp_bt: [B, T] current log-probs of the sampled tokens (with gradient).
      proximal_logp_bt: [B, T] log-probs at the start of this update (no gradient).
      advantages_bt: [B, T] advantages (no gradient).
      loss_mask_bt: [B, T] 1 on trained tokens.
      behaviour_logp_bt: [B, T] engine log-probs at sampling time; needed for "tis" /
        "decoupled".
      agg_mode, agg_norm, global_count: see `aggregate_loss`.

    Returns:
      (loss, metrics): pg_loss, clip_frac_low (A < 0, ratio < 1 - eps_low),
      clip_frac_high (A > 0, ratio > 1 + eps_high), dual_clip_frac, ratio_mean, ratio_max,
      approx_kl (k3 of current vs proximal), num_tokens, plus is_* metrics when off_policy
      is on. Fractions are over trained tokens.
    """
    eps_high = clip_eps_low if clip_eps_high is None else clip_eps_high
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (e.g. 3.0), got {dual_clip_c}")
    mask = jnp.asarray(loss_mask_bt, jnp.float32) > 0
    w_bt, eff_mask, metrics = _off_policy_weight(off_policy, proximal_logp_bt,
                                                 behaviour_logp_bt, mask, is_cap)
    ratio, log_r = _ratio(logp_bt, proximal_logp_bt, mask)
    adv = jnp.where(mask, jax.lax.stop_gradient(advantages_bt), 0.0)
    lo, hi = 1.0 - clip_eps_low, 1.0 + eps_high
    pg_bt = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, lo, hi))
    dual_hit = jnp.zeros(mask.shape, bool)
    if dual_clip_c is not None:
        dual_hit = (adv < 0) & (ratio > dual_clip_c)
        pg_bt = jnp.where(adv < 0, jnp.minimum(pg_bt, -adv * dual_clip_c), pg_bt)
    loss = aggregate_loss(pg_bt * w_bt, eff_mask, mode=agg_mode, norm=agg_norm,
                          global_count=global_count)
    frac = lambda b: masked_mean(b.astype(jnp.float32), mask)  # noqa: E731
    metrics.update({
        "pg_loss": loss,
        "clip_frac_low": frac((adv < 0) & (ratio < lo)),
        "clip_frac_high": frac((adv > 0) & (ratio > hi)),
        "dual_clip_frac": frac(dual_hit),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": masked_max(ratio, mask),
        "approx_kl": masked_mean(jnp.exp(-log_r) - 1.0 + log_r, mask),
        "num_tokens": jnp.sum(mask.astype(jnp.float32)),
    })
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def gspo_policy_loss(*, logp_bt: jax.Array, proximal_logp_bt: jax.Array,
                     advantages_bt: jax.Array, loss_mask_bt: jax.Array,
                     clip_eps_low: float = 3e-4, clip_eps_high: float = 4e-4,
                     agg_mode: str = "seq-mean-token-mean", agg_norm: float | None = None,
                     global_count=None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization").

    The importance ratio is per sequence and length-normalised:
        s_i = exp( mean_{t trained} (logp_t - proximal_logp_t) )
    and the clip (much tighter than PPO's: 3e-4 / 4e-4 in the paper) acts on s_i. Implemented
    in the paper's GSPO-token form, s_it = sg(s_i) * pi(y_t) / sg(pi(y_t)), whose value and
    clipping equal s_i and whose gradient equals GSPO's when the advantage is constant over a
    sequence, while still accepting token-level advantages [B, T].
    Departure: no behaviour-policy correction here (use ppo_policy_loss for off_policy);
    sequences with no trained token are ignored.

    Returns:
      (loss, metrics): pg_loss, seq_clip_frac (fraction of sequences clipped), seq_ratio_mean,
      seq_ratio_max, num_seqs.
    """
    mask = jnp.asarray(loss_mask_bt, jnp.float32) > 0
    maskf = mask.astype(jnp.float32)
    len_b = jnp.sum(maskf, axis=1)
    seq_valid = len_b > 0
    log_r = jnp.where(mask, logp_bt - jax.lax.stop_gradient(proximal_logp_bt), 0.0)
    seq_log_r_b = jnp.clip(safe_div(jnp.sum(log_r, axis=1), len_b),
                           -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    s_b = jnp.exp(jax.lax.stop_gradient(seq_log_r_b))
    logp_masked = jnp.where(mask, logp_bt, 0.0)
    s_bt = s_b[:, None] * jnp.exp(logp_masked - jax.lax.stop_gradient(logp_masked))
    adv = jnp.where(mask, jax.lax.stop_gradient(advantages_bt), 0.0)
    lo, hi = 1.0 - clip_eps_low, 1.0 + clip_eps_high
    pg_bt = jnp.maximum(-adv * s_bt, -adv * jnp.clip(s_bt, lo, hi))
    loss = aggregate_loss(pg_bt, mask, mode=agg_mode, norm=agg_norm, global_count=global_count)
    clipped_b = masked_mean(((adv > 0) & (s_bt > hi)) | ((adv < 0) & (s_bt < lo)), mask,
                            axis=1) > 0
    metrics = {
        "pg_loss": loss,
        "seq_clip_frac": masked_mean(clipped_b.astype(jnp.float32), seq_valid),
        "seq_ratio_mean": masked_mean(s_b, seq_valid),
        "seq_ratio_max": masked_max(s_b, seq_valid),
        "num_seqs": jnp.sum(seq_valid.astype(jnp.float32)),
    }
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)
