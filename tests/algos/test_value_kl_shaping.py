"""Value loss, entropy, log-prob gathering, KL estimators and DAPO shaping against NumPy
references (jitted where the function is a device function)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agentax.algos as A
from algos_np_reference import aggregate, random_mask

B, T, V = 4, 6, 7


@pytest.mark.parametrize("clip_eps", [None, 0.1])
def test_value_loss_matches_loop_and_clipped_gradient_is_zero(clip_eps):
    rng = np.random.default_rng(0)
    mask = random_mask(rng, B, T)
    old = rng.normal(size=(B, T)).astype(np.float32)
    v = (old + 0.3 * rng.normal(size=(B, T))).astype(np.float32)
    ret = rng.normal(size=(B, T)).astype(np.float32)
    fn = functools.partial(A.value_loss, old_values_bt=old, returns_bt=ret, loss_mask_bt=mask,
                           clip_eps=clip_eps)
    (loss, metrics), grad = jax.jit(jax.value_and_grad(lambda x: fn(values_bt=x),
                                                       has_aux=True))(v)
    err = (v - ret) ** 2
    if clip_eps is None:
        tok, clipped = 0.5 * err, np.zeros_like(mask, bool)
    else:
        err_c = (old + np.clip(v - old, -clip_eps, clip_eps) - ret) ** 2
        tok, clipped = 0.5 * np.maximum(err, err_c), err_c > err
    np.testing.assert_allclose(loss, aggregate(tok, mask, "token-mean"), rtol=1e-5)
    np.testing.assert_allclose(metrics["vf_clip_frac"], clipped[mask > 0].mean(), rtol=1e-6)
    grad = np.asarray(grad)
    assert np.all(grad[mask == 0] == 0.0)
    if clip_eps is not None:
        outside = clipped & (np.abs(v - old) > clip_eps) & (mask > 0)
        assert outside.any() and np.all(grad[outside] == 0.0)


def test_entropy_and_logprobs_match_numpy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(B, T, V)).astype(np.float32) * 3
    logits[0, 0, :3] = -np.inf  # masked vocabulary entries
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(p > 0, p * np.log(p), 0.0).sum(-1)
    got = np.asarray(jax.jit(A.token_entropy)(logits))
    np.testing.assert_allclose(got, ent, rtol=1e-5, atol=1e-6)
    mask = random_mask(rng, B, T, empty_rows=0)
    bonus, metrics = jax.jit(functools.partial(A.entropy_bonus, coef=0.01))(
        logits_btv=logits, loss_mask_bt=mask)
    np.testing.assert_allclose(metrics["entropy"], ent[mask > 0].mean(), rtol=1e-5)
    np.testing.assert_allclose(bonus, -0.01 * ent[mask > 0].mean(), rtol=1e-5)
    g = jax.jit(jax.grad(lambda x: A.entropy_bonus(logits_btv=x, loss_mask_bt=mask,
                                                   coef=1.0)[0]))(logits)
    assert np.all(np.isfinite(np.asarray(g)))
    ids = rng.integers(3, V, size=(B, T))
    lp = np.asarray(jax.jit(A.gather_logprobs)(logits, ids))
    np.testing.assert_allclose(lp, np.log(np.take_along_axis(p, ids[..., None], -1)[..., 0]),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", A.KL_KINDS)
def test_kl_estimators_match_formulas(kind):
    rng = np.random.default_rng(2)
    logp = -rng.random((B, T)).astype(np.float32) * 2
    ref = (logp + 0.5 * rng.normal(size=(B, T))).astype(np.float32)
    log_r = ref - logp
    expected = {"k1": -log_r, "k2": 0.5 * log_r ** 2, "squared": 0.5 * log_r ** 2,
                "k3": np.exp(log_r) - 1 - log_r}[kind]
    got = jax.jit(functools.partial(A.kl_estimate, kind=kind))(logp, ref)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    mask = random_mask(rng, B, T)
    loss, metrics = jax.jit(functools.partial(A.kl_loss, kind=kind))(
        logp_bt=logp, ref_logp_bt=ref, loss_mask_bt=mask)
    np.testing.assert_allclose(loss, expected[mask > 0].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["kl_max"], expected[mask > 0].max(), rtol=1e-5)


def test_k1_k3_are_unbiased_and_k3_nonnegative_on_a_known_pair():
    # pi = softmax(a), ref = softmax(b): the exact expectation over y ~ pi of k1 and k3 is
    # KL(pi || ref); k2 is only a second-order approximation.
    a, b = jnp.array([1.0, 0.0, -1.0, 2.0]), jnp.array([0.0, 0.5, 0.0, -1.0])
    lp, lr = jax.nn.log_softmax(a), jax.nn.log_softmax(b)
    p = jnp.exp(lp)
    exact = float(jnp.sum(p * (lp - lr)))
    for kind in ("k1", "k3"):
        est = jax.jit(functools.partial(A.kl_estimate, kind=kind))(lp, lr)
        np.testing.assert_allclose(float(jnp.sum(p * est)), exact, rtol=1e-5)
    assert float(jnp.min(A.kl_estimate(lp, lr, kind="k3"))) >= 0.0
    assert float(jnp.min(A.kl_estimate(lp, lr, kind="k1"))) < 0.0  # why k3 exists


def test_kl_in_reward_subtracts_only_on_trained_tokens():
    rng = np.random.default_rng(3)
    mask = random_mask(rng, B, T)
    tok_r = rng.normal(size=(B, T)).astype(np.float32)
    logp = -rng.random((B, T)).astype(np.float32)
    ref = -rng.random((B, T)).astype(np.float32)
    shaped, metrics = jax.jit(functools.partial(A.kl_in_reward, beta=0.1))(
        token_rewards_bt=tok_r, logp_bt=logp, ref_logp_bt=ref, loss_mask_bt=mask)
    kl = np.where(mask > 0, logp - ref, 0.0)
    np.testing.assert_allclose(shaped, tok_r - 0.1 * kl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["kl_reward_mean"], kl[mask > 0].mean(), rtol=1e-5)


def test_kl_unknown_kind():
    with pytest.raises(ValueError, match="unknown KL estimator"):
        A.kl_estimate(jnp.zeros(2), jnp.zeros(2), kind="k4")


def test_dynamic_sampling_keep_mask_matches_loop():
    rng = np.random.default_rng(4)
    r = rng.integers(0, 2, size=(12, 4)).astype(np.float64)
    r[0] = 1.0
    r[1] = 0.0
    valid = rng.random((12, 4)) > 0.2
    valid[2] = [True, False, False, False]
    keep = A.dynamic_sampling_keep_mask(r, valid)
    expected = []
    for i in range(12):
        vals = {r[i, j] for j in range(4) if valid[i, j]}
        expected.append(valid[i].sum() >= 2 and len(vals) > 1)
    np.testing.assert_array_equal(keep, expected)
    assert keep.dtype == bool and not keep[0] and not keep[1] and not keep[2]
    assert not A.dynamic_sampling_keep_mask([[1.0, 1.05]], atol=0.1)[0]
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        A.dynamic_sampling_keep_mask([1.0, 0.0])


@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_overlong_penalty_matches_piecewise(factor):
    lengths = np.array([0, 10, 12, 13, 15, 16, 17])
    max_len, cache = 16, 4
    got = jax.jit(functools.partial(A.overlong_penalty, max_len=max_len, cache_len=cache,
                                    factor=factor))(lengths)
    exp = [0.0 if n <= 12 else (-1.0 if n > 16 else (12 - n) / 4) for n in lengths]
    np.testing.assert_allclose(got, factor * np.array(exp), rtol=1e-6)
    with pytest.raises(ValueError, match="cache_len"):
        A.overlong_penalty(lengths, max_len=4, cache_len=8)


def test_check_finite_rewards_names_positions():
    A.check_finite_rewards(np.array([[0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"2 non-finite value\(s\) at index \(0, 1\), \(1, 0\)"):
        A.check_finite_rewards(np.array([[0.0, np.nan], [np.inf, 1.0]]))
