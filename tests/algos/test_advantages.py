"""Advantage estimators against plain-loop references, under jax.jit, with masks and padding."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import agentax.algos as A
from algos_np_reference import gae, group_adv, place_reward, random_mask, returns, whiten

GROUP_FNS = {
    "grpo": A.grpo_advantages,
    "dr_grpo": A.dr_grpo_advantages,
    "rloo": A.rloo_advantages,
}


@pytest.mark.parametrize("kind", A.GROUP_ESTIMATORS)
@pytest.mark.parametrize("g", [1, 2, 5])
def test_group_estimators_match_loop(kind, g):
    rng = np.random.default_rng(g)
    r = rng.normal(size=(6, g)).astype(np.float32)
    valid = rng.random((6, g)) > 0.25
    valid[0] = True
    r[~valid] = np.nan  # padding may be garbage; it must not leak into the stats
    got = jax.jit(GROUP_FNS[kind])(r, valid)
    np.testing.assert_allclose(got, group_adv(kind, r, valid), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[~valid] == 0.0)
    if g == 1:
        assert np.all(np.asarray(got) == 0.0)  # no baseline: advantage 0, not NaN


@pytest.mark.parametrize("ddof", [0, 1])
def test_grpo_eps_and_ddof_and_equal_rewards(ddof):
    r = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]], np.float32)
    got = np.asarray(jax.jit(functools.partial(A.grpo_advantages, eps=0.1, std_ddof=ddof))(r))
    np.testing.assert_allclose(got, group_adv("grpo", r, np.ones_like(r, bool), 0.1, ddof),
                               rtol=1e-6)
    assert np.all(got[0] == 0.0)  # all-equal group: std 0 -> advantage 0, not inf


@pytest.mark.parametrize("kind", A.GROUP_ESTIMATORS)
def test_flat_group_ids_match_grouped_layout(kind):
    rng = np.random.default_rng(7)
    n, g = 5, 4
    r = rng.normal(size=(n, g)).astype(np.float32)
    valid = rng.random((n, g)) > 0.2
    perm = rng.permutation(n * g)  # interleave the groups
    ids = np.repeat(np.arange(n), g)[perm]
    flat = jax.jit(functools.partial(A.group_advantages_flat, kind=kind, num_groups=n))(
        r.reshape(-1)[perm], ids, valid.reshape(-1)[perm])
    expected = group_adv(kind, r, valid).reshape(-1)[perm]
    np.testing.assert_allclose(flat, expected, rtol=1e-5, atol=1e-5)


def test_contiguous_group_ids():
    np.testing.assert_array_equal(A.contiguous_group_ids(6, 3), [0, 0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match="multiple of group_size"):
        A.contiguous_group_ids(7, 3)


def test_place_sequence_reward_and_returns():
    rng = np.random.default_rng(0)
    mask = random_mask(rng, 5, 9)
    r = rng.normal(size=5).astype(np.float32)
    tok = np.asarray(jax.jit(A.place_sequence_reward)(r, mask))
    np.testing.assert_allclose(tok, place_reward(r, mask), rtol=1e-6)
    assert np.all(tok[0] == 0.0)  # empty row gets nothing
    extra = rng.normal(size=(5, 9)).astype(np.float32)
    got = jax.jit(functools.partial(A.discounted_returns, gamma=0.9))(tok + extra, mask)
    np.testing.assert_allclose(got, returns(tok + extra, mask, 0.9), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_token_rewards", [False, True])
def test_reinforce_pp_matches_loop(with_token_rewards):
    rng = np.random.default_rng(3)
    mask = random_mask(rng, 6, 10)
    r = rng.normal(size=6).astype(np.float32)
    tok_r = (0.1 * rng.normal(size=(6, 10))).astype(np.float32) if with_token_rewards else None
    adv, ret = jax.jit(functools.partial(A.reinforce_pp_advantages, gamma=0.95))(
        rewards_b=r, loss_mask_bt=mask, token_rewards_bt=tok_r)
    tok = place_reward(r, mask) + (0.0 if tok_r is None else tok_r)
    exp_ret = returns(tok, mask, 0.95)
    np.testing.assert_allclose(ret, exp_ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, whiten(exp_ret, mask), rtol=1e-4, atol=1e-4)
    assert abs(float(A.masked_mean(adv, mask))) < 1e-5


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
@pytest.mark.parametrize("bootstrap", [False, True])
def test_gae_matches_loop(gamma, lam, bootstrap):
    rng = np.random.default_rng(11)
    b, t = 4, 12
    mask = random_mask(rng, b, t)
    rew = rng.normal(size=(b, t)).astype(np.float32)
    val = rng.normal(size=(b, t)).astype(np.float32)
    boot = rng.normal(size=b).astype(np.float32) if bootstrap else None
    fn = jax.jit(functools.partial(A.gae_advantages, gamma=gamma, lam=lam))
    adv, ret = fn(token_rewards_bt=rew, values_bt=val, loss_mask_bt=mask,
                  bootstrap_value_b=boot)
    exp_adv, exp_ret = gae(rew, val, mask, gamma, lam, boot)
    np.testing.assert_allclose(adv, exp_adv, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ret, exp_ret, rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(adv)[mask == 0] == 0.0)


def test_gae_lambda_one_gamma_one_is_return_minus_value():
    rng = np.random.default_rng(1)
    mask = random_mask(rng, 3, 8, empty_rows=0)
    rew = rng.normal(size=(3, 8)).astype(np.float32)
    val = rng.normal(size=(3, 8)).astype(np.float32)
    adv, _ = jax.jit(A.gae_advantages)(token_rewards_bt=rew, values_bt=val, loss_mask_bt=mask)
    np.testing.assert_allclose(adv, np.where(mask > 0, returns(rew, mask, 1.0) - val, 0.0),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", A.ADVANTAGE_ESTIMATORS)
def test_registry_uniform_signature_under_jit(name):
    rng = np.random.default_rng(5)
    b, t, g = 8, 6, 4
    mask = random_mask(rng, b, t)
    r = rng.normal(size=b).astype(np.float32)
    valid = np.ones(b, np.float32)
    valid[-1] = 0.0
    est = A.get_advantage_estimator(name)

    @jax.jit
    def step(r, mask, valid, values):
        return est(rewards_b=r, loss_mask_bt=mask, group_ids_b=A.contiguous_group_ids(b, g),
                   valid_b=valid, values_bt=values)

    adv, ret = step(r, mask, valid, rng.normal(size=(b, t)).astype(np.float32))
    adv = np.asarray(adv)
    assert adv.shape == (b, t) and ret.shape == (b, t)
    assert np.all(np.isfinite(adv)) and np.all(adv[mask == 0] == 0.0) and np.all(adv[-1] == 0)
    if name in A.GROUP_ESTIMATORS:
        eff = mask * valid[:, None]
        per_seq = group_adv(name, r.reshape(2, g), valid.reshape(2, g) > 0)
        np.testing.assert_allclose(adv, per_seq.reshape(b)[:, None] * eff, rtol=1e-5,
                                   atol=1e-5)


def test_registry_errors_name_the_fix():
    with pytest.raises(ValueError, match="did you mean 'grpo'"):
        A.get_advantage_estimator("grpoo")
    m = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="needs values_bt"):
        A.get_advantage_estimator("gae")(rewards_b=jnp.ones(2), loss_mask_bt=m)
    with pytest.raises(ValueError, match="needs group_ids_b"):
        A.get_advantage_estimator("rloo")(rewards_b=jnp.ones(2), loss_mask_bt=m)
    with pytest.raises(ValueError, match="kl_loss"):
        A.get_advantage_estimator("grpo")(rewards_b=jnp.ones(2), loss_mask_bt=m,
                                          group_ids_b=jnp.zeros(2, jnp.int32),
                                          token_rewards_bt=m)
