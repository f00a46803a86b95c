"""Advantage estimators: GRPO, Dr. GRPO, RLOO (group baselines), REINFORCE++, GAE.

Group estimators take rewards as [N, G] (N groups of G samples of one task) with an optional
validity mask (a padded or failed sample is invalid: it gets advantage 0 and does not enter
its group's statistics). `group_advantages_flat` computes the same numbers for a flat [B]
batch with integer group ids. Token-level estimators (REINFORCE++, GAE) take [B, T] arrays
with `loss_mask_bt` (1 on trained tokens) and return [B, T] advantages and returns.

A group with fewer than two valid samples has no baseline to compare against; its
advantages are 0 (documented, tested), never NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentax.algos._masked import masked_whiten, safe_div

GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")


def _valid(valid, like):
    if valid is None:
        return jnp.ones(like.shape, jnp.float32)
    return jnp.asarray(valid, jnp.float32)


def _from_group_stats(kind, r, valid, n, mean, m2, *, eps, std_ddof):
    """Per-sample advantage from its group's count n, mean and sum of squared deviations."""
    centred = r - mean
    if kind == "grpo":
        std = jnp.sqrt(safe_div(m2, jnp.maximum(n - std_ddof, 0.0)))
        adv = centred / (std + eps)
    elif kind == "dr_grpo":
        adv = centred
    elif kind == "rloo":
        adv = centred * safe_div(n, n - 1.0)
    else:
        raise ValueError(f"unknown group estimator {kind!r}; choose one of {GROUP_ESTIMATORS}")
    return jnp.where((valid > 0) & (n > 1), adv, 0.0)


def _group_ng(kind, rewards_ng, valid_ng, eps, std_ddof):
    r = jnp.asarray(rewards_ng, jnp.float32)
    v = _valid(valid_ng, r)
    r = jnp.where(v > 0, r, 0.0)  # padding may hold NaN
    n = jnp.sum(v, axis=1, keepdims=True)  # [N, 1]
    mean = safe_div(jnp.sum(r * v, axis=1, keepdims=True), n)
    m2 = jnp.sum(v * jnp.square(r - mean), axis=1, keepdims=True)
    return _from_group_stats(kind, r, v, n, mean, m2, eps=eps, std_ddof=std_ddof)


def grpo_advantages(rewards_ng: jax.Array, valid_ng: jax.Array | None = None, *,
                    eps: float = 1e-6, std_ddof: int = 1) -> jax.Array:
    """GRPO outcome advantage (Shao et al. 2024, "DeepSeekMath"): (r - mean_g) / (std_g + eps).

    Departures: std uses `std_ddof` (1 = unbiased, as TRL/verl; 0 = population); a group with
    fewer than 2 valid samples (e.g. G = 1) has undefined std and gets advantage 0.

    Args:
      rewards_ng: [N, G] scalar reward per sample.
      valid_ng: [N, G] optional 0/1 validity mask (invalid -> advantage 0, excluded from stats).
    Returns:
      [N, G] float32 advantages.
    """
    return _group_ng("grpo", rewards_ng, valid_ng, eps, std_ddof)


def dr_grpo_advantages(rewards_ng: jax.Array, valid_ng: jax.Array | None = None) -> jax.Array:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training"): r - mean_g.

    No division by the group std (which up-weights too-easy / too-hard questions). Dr. GRPO
    also drops per-sequence length normalisation: pair it with
    `aggregate_loss(mode="seq-mean-token-sum-norm", norm=max_generation_length)`.
    Groups with fewer than 2 valid samples get 0.
    """
    return _group_ng("dr_grpo", rewards_ng, valid_ng, 0.0, 0)


def rloo_advantages(rewards_ng: jax.Array, valid_ng: jax.Array | None = None) -> jax.Array:
    """RLOO advantage (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

    A_i = r_i - mean_{j != i} r_j over the valid samples of the group, which equals
    n / (n - 1) * (r_i - mean). Groups with fewer than 2 valid samples get 0.
    """
    return _group_ng("rloo", rewards_ng, valid_ng, 0.0, 0)


def group_advantages_flat(rewards_b: jax.Array, group_ids_b: jax.Array,
                          valid_b: jax.Array | None = None, *, kind: str = "grpo",
                          num_groups: int | None = None, eps: float = 1e-6,
                          std_ddof: int = 1) -> jax.Array:
    """Group advantages for a flat batch: samples i, j share a group iff group ids match.

    Same numbers as `grpo_advantages` / `dr_grpo_advantages` / `rloo_advantages` on the
    [N, G] layout, but groups may be interleaved and of different sizes.

    Args:
      rewards_b: [B] rewards.
      group_ids_b: [B] int ids in [0, num_groups).
      valid_b: [B] optional validity mask.
      kind: "grpo", "dr_grpo" or "rloo" (static).
      num_groups: static upper bound on ids (default B, always enough for ids < B).
    Returns:
      [B] float32 advantages.
    """
    r = jnp.asarray(rewards_b, jnp.float32)
    v = _valid(valid_b, r)
    r = jnp.where(v > 0, r, 0.0)
    ids = jnp.asarray(group_ids_b, jnp.int32)
    k = r.shape[0] if num_groups is None else int(num_groups)
    seg = lambda x: jax.ops.segment_sum(x, ids, num_segments=k)  # noqa: E731
    n = seg(v)[ids]
    mean = safe_div(seg(r * v)[ids], n)
    m2 = seg(v * jnp.square(r - mean))[ids]
    return _from_group_stats(kind, r, v, n, mean, m2, eps=eps, std_ddof=std_ddof)


def contiguous_group_ids(batch_size: int, group_size: int) -> jax.Array:
    """[B] group ids for a batch laid out as consecutive groups of `group_size` samples."""
    if group_size <= 0 or batch_size % group_size:
        raise ValueError(f"batch_size {batch_size} must be a positive multiple of "
                         f"group_size {group_size}")
    return jnp.arange(batch_size, dtype=jnp.int32) // group_size


def place_sequence_reward(rewards_b: jax.Array, loss_mask_bt: jax.Array) -> jax.Array:
    """[B, T] token rewards holding each sequence's scalar reward at its last trained token.

    Rows with no trained token get no reward (all zeros).
    """
    mask = jnp.asarray(loss_mask_bt, jnp.float32) > 0
    t = jnp.arange(mask.shape[1])
    last_b = jnp.max(jnp.where(mask, t[None, :], -1), axis=1)  # [B]
    is_last = (t[None, :] == last_b[:, None]) & mask
    return jnp.where(is_last, jnp.asarray(rewards_b, jnp.float32)[:, None], 0.0)


def _reverse_masked_scan(step, init, xs_bt):
    """Scan over T from the end; xs are [B, T] arrays, transposed to time-major for scan."""
    xs_tb = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), xs_bt)
    _, ys_tb = jax.lax.scan(step, init, xs_tb, reverse=True)
    return jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1), ys_tb)


def discounted_returns(token_rewards_bt: jax.Array, loss_mask_bt: jax.Array, *,
                       gamma: float = 1.0) -> jax.Array:
    """Reward-to-go G_t = r_t + gamma * G_{t'} where t' is the next trained token.

    Untrained positions (prompt, tool output) are skipped: they neither add reward nor count
    as a discount step, so time is measured in generated tokens. They return 0.
    """
    mask = jnp.asarray(loss_mask_bt, jnp.float32) > 0
    rew = jnp.where(mask, jnp.asarray(token_rewards_bt, jnp.float32), 0.0)

    def step(g_next, x):
        r_t, m_t = x
        g = jnp.where(m_t, r_t + gamma * g_next, g_next)
        return g, jnp.where(m_t, g, 0.0)

    init = jnp.zeros(rew.shape[0], jnp.float32)
    return _reverse_masked_scan(step, init, (rew, mask))


def reinforce_pp_advantages(*, rewards_b: jax.Array, loss_mask_bt: jax.Array,
                            token_rewards_bt: jax.Array | None = None, gamma: float = 1.0,
                            eps: float = 1e-8) -> tuple[jax.Array, jax.Array]:
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning LLMs").

    The scalar reward sits on each sequence's last trained token, plus optional per-token
    rewards (typically -beta * KL from `kl_in_reward`); the token return-to-go is then
    normalised by the mean and std over *all* trained tokens of the batch.

    Departure: "global batch" is whatever batch is passed in; under gradient accumulation
    compute this once on the full optimizer batch, not per micro-batch.

    Returns:
      (advantages_bt, returns_bt), both [B, T] and 0 on untrained tokens.
    """
    tok = place_sequence_reward(rewards_b, loss_mask_bt)
    if token_rewards_bt is not None:
        tok = tok + jnp.asarray(token_rewards_bt, jnp.float32)
    returns_bt = discounted_returns(tok, loss_mask_bt, gamma=gamma)
    return masked_whiten(returns_bt, loss_mask_bt, eps=eps), returns_bt


def gae_advantages(*, token_rewards_bt: jax.Array, values_bt: jax.Array,
                   loss_mask_bt: jax.Array, gamma: float = 1.0, lam: float = 1.0,
                   bootstrap_value_b: jax.Array | None = None
                   ) -> tuple[jax.Array, jax.Array]:
    """Generalised Advantage Estimation (Schulman et al. 2016) for PPO with a value head.

    delta_t = r_t + gamma * V(t') - V(t);  A_t = delta_t + gamma * lam * A_{t'}
    where t' is the next trained token of the same row (a backwards `lax.scan` over T).

    Departure for multi-turn episodes: untrained positions (prompt, tool and environment
    tokens) are skipped, not treated as steps. After the last trained token the next value
    is `bootstrap_value_b` (default 0: the episode ended; pass V(s_T) for truncation).

    Args:
      token_rewards_bt: [B, T] per-token rewards (see `place_sequence_reward`,
        `kl_in_reward`).
      values_bt: [B, T] value predictions recorded before the update (no gradient).
      loss_mask_bt: [B, T] 1 on trained tokens.
    Returns:
      (advantages_bt, returns_bt = advantages + values), both [B, T], 0 on untrained tokens.
    """
    mask = jnp.asarray(loss_mask_bt, jnp.float32) > 0
    rew = jnp.where(mask, jnp.asarray(token_rewards_bt, jnp.float32), 0.0)
    val = jnp.where(mask, jax.lax.stop_gradient(jnp.asarray(values_bt, jnp.float32)), 0.0)
    batch = rew.shape[0]
    v_last = (jnp.zeros(batch, jnp.float32) if bootstrap_value_b is None
              else jnp.asarray(bootstrap_value_b, jnp.float32))

    def step(carry, x):
        v_next, a_next = carry
        r_t, v_t, m_t = x
        delta = r_t + gamma * v_next - v_t
        a = delta + gamma * lam * a_next
        carry = (jnp.where(m_t, v_t, v_next), jnp.where(m_t, a, a_next))
        return carry, jnp.where(m_t, a, 0.0)

    init = (v_last, jnp.zeros(batch, jnp.float32))
    adv_bt = _reverse_masked_scan(step, init, (rew, val, mask))
    return adv_bt, jnp.where(mask, adv_bt + val, 0.0)
