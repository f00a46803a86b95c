"""Loss aggregation, PPO (clip-higher, dual-clip, TIS, decoupled) and GSPO against loop
references under jax.jit, with gradient checks and all-masked / NaN-padding safety."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agentax.algos as A
from algos_np_reference import aggregate, ppo_token_loss, random_mask

B, T = 5, 8


def _inputs(seed, spread=0.4):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T)
    prox = (-rng.random((B, T)) * 3).astype(np.float32)
    logp = (prox + spread * rng.normal(size=(B, T))).astype(np.float32)
    behav = (prox + 0.5 * rng.normal(size=(B, T))).astype(np.float32)
    adv = rng.normal(size=(B, T)).astype(np.float32)
    # padding holds garbage: it must not produce NaN anywhere
    for arr in (logp, prox, behav):
        arr[mask == 0] = -np.inf
    adv[mask == 0] = np.nan
    return mask, logp, prox, behav, adv


@pytest.mark.parametrize("mode", A.AGG_MODES)
def test_aggregate_matches_loop(mode):
    rng = np.random.default_rng(0)
    mask = random_mask(rng, B, T, empty_rows=2)
    loss = rng.normal(size=(B, T)).astype(np.float32)
    loss[mask == 0] = np.nan
    got = jax.jit(functools.partial(A.aggregate_loss, mode=mode, norm=16.0))(loss, mask)
    np.testing.assert_allclose(got, aggregate(np.nan_to_num(loss), mask, mode, 16.0),
                               rtol=1e-5)
    empty = jax.jit(functools.partial(A.aggregate_loss, mode=mode))(loss, np.zeros_like(mask))
    assert float(empty) == 0.0


def test_aggregate_global_count_sums_micro_batches_to_full_batch():
    rng = np.random.default_rng(1)
    mask = random_mask(rng, 4, T, empty_rows=0)
    loss = rng.normal(size=(4, T)).astype(np.float32)
    full = A.aggregate_loss(loss, mask, mode="token-mean")
    halves = sum(A.aggregate_loss(loss[s], mask[s], mode="token-mean",
                                  global_count=mask.sum()) for s in (slice(0, 2), slice(2, 4)))
    np.testing.assert_allclose(halves, full, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown loss aggregation mode"):
        A.aggregate_loss(loss, mask, mode="token-sum")


@pytest.mark.parametrize("eps_low,eps_high,dual_c", [(0.2, None, None), (0.2, 0.28, None),
                                                     (0.2, 0.28, 3.0)])
@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_ppo_matches_loop(eps_low, eps_high, dual_c, agg_mode):
    mask, logp, prox, _, adv = _inputs(2, spread=0.6)
    fn = jax.jit(functools.partial(A.ppo_policy_loss, clip_eps_low=eps_low,
                                   clip_eps_high=eps_high, dual_clip_c=dual_c,
                                   agg_mode=agg_mode))
    loss, metrics = fn(logp_bt=logp, proximal_logp_bt=prox, advantages_bt=adv,
                       loss_mask_bt=mask)
    hi = eps_low if eps_high is None else eps_high
    lp, pp, aa = (np.where(mask > 0, x, 0.0) for x in (logp, prox, adv))
    tok = ppo_token_loss(lp, pp, aa, eps_low, hi, dual_c)
    np.testing.assert_allclose(loss, aggregate(tok, mask, agg_mode), rtol=1e-5)
    ratio = np.exp(lp - pp)
    on = mask > 0
    np.testing.assert_allclose(metrics["clip_frac_high"],
                               ((aa > 0) & (ratio > 1 + hi))[on].mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_frac_low"],
                               ((aa < 0) & (ratio < 1 - eps_low))[on].mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["ratio_max"], ratio[on].max(), rtol=1e-5)
    np.testing.assert_allclose(metrics["ratio_mean"], ratio[on].mean(), rtol=1e-5)
    assert float(metrics["num_tokens"]) == mask.sum()
    assert all(np.isfinite(np.asarray(v)) for v in metrics.values())


def test_ppo_gradient_is_zero_exactly_on_clipped_tokens():
    mask, logp, prox, _, adv = _inputs(4, spread=0.8)
    fn = functools.partial(A.ppo_policy_loss, proximal_logp_bt=prox, advantages_bt=adv,
                           loss_mask_bt=mask, clip_eps_low=0.2, clip_eps_high=0.28,
                           dual_clip_c=3.0)
    grad = np.asarray(jax.jit(jax.grad(lambda lp: fn(logp_bt=lp)[0]))(logp))
    ratio = np.exp(np.where(mask > 0, logp, 0.0) - np.where(mask > 0, prox, 0.0))
    a = np.where(mask > 0, adv, 0.0)
    clipped = (((a > 0) & (ratio > 1.28)) | ((a < 0) & (ratio < 0.8))
               | ((a < 0) & (ratio > 3.0)))
    live = (mask > 0) & ~clipped & (a != 0)
    assert clipped[mask > 0].any() and live.any()
    assert np.all(grad[clipped] == 0.0) and np.all(grad[mask == 0] == 0.0)
    # token-mean: d/dlogp of -A * ratio / N
    np.testing.assert_allclose(grad[live], (-a * ratio / mask.sum())[live], rtol=1e-5)


@pytest.mark.parametrize("off_policy", ["tis", "decoupled"])
@pytest.mark.parametrize("cap", [None, 1.5])
def test_off_policy_weights_match_loop(off_policy, cap):
    mask, logp, prox, behav, adv = _inputs(6)
    fn = jax.jit(functools.partial(A.ppo_policy_loss, off_policy=off_policy, is_cap=cap,
                                   clip_eps_high=0.28))
    loss, metrics = fn(logp_bt=logp, proximal_logp_bt=prox, advantages_bt=adv,
                       loss_mask_bt=mask, behaviour_logp_bt=behav)
    lp, pp, bb, aa = (np.where(mask > 0, x, 0.0) for x in (logp, prox, behav, adv))
    w = np.exp(pp - bb)
    eff = mask.copy()
    if off_policy == "tis":
        w = np.minimum(w, 2.0 if cap is None else cap)
    elif cap is not None:
        eff = mask * (w <= cap)
    tok = ppo_token_loss(lp, pp, aa, 0.2, 0.28, None) * w
    np.testing.assert_allclose(loss, aggregate(tok, eff, "token-mean"), rtol=1e-5)
    np.testing.assert_allclose(metrics["is_weight_max"], np.exp(pp - bb)[mask > 0].max(),
                               rtol=1e-5)
    kl = (np.exp(pp - bb) - 1 - (pp - bb))[mask > 0].mean()
    np.testing.assert_allclose(metrics["behaviour_kl"], kl, rtol=1e-5)
    if off_policy == "decoupled" and cap is not None:
        np.testing.assert_allclose(metrics["is_masked_frac"], (w > cap)[mask > 0].mean())


def test_truncated_importance_weights_are_constants():
    mask, _, prox, behav, _ = _inputs(8)
    w, metrics = jax.jit(functools.partial(A.truncated_importance_weights, cap=1.2))(
        proximal_logp_bt=prox, behaviour_logp_bt=behav, loss_mask_bt=mask)
    raw = np.exp(np.where(mask > 0, prox, 0.0) - np.where(mask > 0, behav, 0.0))
    np.testing.assert_allclose(w, np.where(mask > 0, np.minimum(raw, 1.2), 0.0), rtol=1e-5)
    np.testing.assert_allclose(metrics["is_truncated_frac"], (raw > 1.2)[mask > 0].mean())
    g = jax.jit(jax.grad(lambda p: jnp.sum(A.truncated_importance_weights(
        proximal_logp_bt=p, behaviour_logp_bt=behav, loss_mask_bt=mask)[0])))(prox)
    assert np.all(np.asarray(g) == 0.0)


@pytest.mark.parametrize("off_policy", ["tis", "decoupled"])
def test_fresh_tokens_make_off_policy_correction_a_no_op(off_policy):
    # max_staleness = 0 and matching numerics: behaviour == proximal, weight 1 everywhere.
    mask, logp, prox, _, adv = _inputs(9)
    kw = dict(logp_bt=logp, proximal_logp_bt=prox, advantages_bt=adv, loss_mask_bt=mask)
    base, _ = jax.jit(A.ppo_policy_loss)(**kw)
    corr, metrics = jax.jit(functools.partial(A.ppo_policy_loss, off_policy=off_policy,
                                              is_cap=1.5))(**kw, behaviour_logp_bt=prox)
    np.testing.assert_allclose(corr, base, rtol=1e-6)
    assert float(metrics["behaviour_kl"]) == 0.0


def test_ppo_all_masked_is_zero_without_nan():
    _, logp, prox, behav, adv = _inputs(3)
    mask = np.zeros((B, T), np.float32)

    def f(lp):
        return A.ppo_policy_loss(logp_bt=lp, proximal_logp_bt=prox, advantages_bt=adv,
                                 loss_mask_bt=mask, behaviour_logp_bt=behav,
                                 off_policy="decoupled", dual_clip_c=3.0)

    (loss, metrics), grad = jax.jit(jax.value_and_grad(f, has_aux=True))(logp)
    assert float(loss) == 0.0
    assert np.all(np.asarray(grad) == 0.0)
    assert all(float(v) == 0.0 for v in metrics.values())


def test_ppo_input_errors():
    m = jnp.ones((1, 2))
    with pytest.raises(ValueError, match="needs behaviour_logp_bt"):
        A.ppo_policy_loss(logp_bt=m, proximal_logp_bt=m, advantages_bt=m, loss_mask_bt=m,
                          off_policy="tis")
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        A.ppo_policy_loss(logp_bt=m, proximal_logp_bt=m, advantages_bt=m, loss_mask_bt=m,
                          dual_clip_c=0.5)
    with pytest.raises(ValueError, match="unknown off_policy"):
        A.ppo_policy_loss(logp_bt=m, proximal_logp_bt=m, advantages_bt=m, loss_mask_bt=m,
                          off_policy="vtrace")


def _gspo_reference(logp, prox, adv_b, mask, lo, hi):
    losses = []
    for i in range(mask.shape[0]):
        n = mask[i].sum()
        if n == 0:
            continue
        s = math.exp(float(((logp[i] - prox[i]) * mask[i]).sum() / n))
        a = adv_b[i]
        losses.append(max(-a * s, -a * min(max(s, 1 - lo), 1 + hi)))
    return float(np.mean(losses))


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.05, 0.05)])
def test_gspo_matches_sequence_formula_value_and_gradient(eps):
    mask, logp, prox, _, _ = _inputs(10, spread=0.02)
    rng = np.random.default_rng(10)
    adv_b = rng.normal(size=B).astype(np.float32)
    adv_bt = np.broadcast_to(adv_b[:, None], (B, T)).copy()
    lp0, pp = (np.where(mask > 0, x, 0.0).astype(np.float32) for x in (logp, prox))
    fn = functools.partial(A.gspo_policy_loss, proximal_logp_bt=pp, advantages_bt=adv_bt,
                           loss_mask_bt=mask, clip_eps_low=eps[0], clip_eps_high=eps[1])
    (loss, metrics), grad = jax.jit(jax.value_and_grad(lambda lp: fn(logp_bt=lp),
                                                       has_aux=True))(lp0)
    np.testing.assert_allclose(loss, _gspo_reference(lp0, pp, adv_b, mask, *eps), rtol=1e-5)

    def seq_gspo(lp):  # GSPO as written: ratio of the length-normalised sequence likelihood
        n = jnp.sum(mask, 1)
        ok = n > 0
        s = jnp.exp(jnp.where(ok, jnp.sum((lp - pp) * mask, 1) / jnp.where(ok, n, 1), 0.0))
        l_ = jnp.maximum(-adv_b * s, -adv_b * jnp.clip(s, 1 - eps[0], 1 + eps[1]))
        return jnp.sum(jnp.where(ok, l_, 0.0)) / jnp.sum(ok)

    np.testing.assert_allclose(grad, jax.grad(seq_gspo)(lp0), rtol=1e-4, atol=1e-7)
    assert float(metrics["num_seqs"]) == (mask.sum(1) > 0).sum()
    if eps[0] < 1e-3:
        assert float(metrics["seq_clip_frac"]) > 0  # 3e-4 clips a 2 % log-prob jitter
