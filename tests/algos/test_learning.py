"""The pieces compose into a jitted train step that learns, on- and off-policy.

A 5-armed bandit policy (softmax over logits) is trained with GRPO advantages from the
registry, the PPO loss with clip-higher, a k3 KL term and an entropy bonus, all called by
keyword inside one jitted step, as the trainer will. With stale samples (policy two versions
old) and the decoupled correction it must still learn.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import agentax.algos as A

N, G, V, GOOD = 8, 4, 5, 3


def _loss(theta, ids_bt, behaviour_bt, proximal_bt, rewards_b, mask_bt, off_policy):
    logits_btv = jnp.broadcast_to(theta, ids_bt.shape + (V,))
    logp_bt = A.gather_logprobs(logits_btv, ids_bt)
    adv_bt, _ = A.get_advantage_estimator("grpo")(
        rewards_b=rewards_b, loss_mask_bt=mask_bt,
        group_ids_b=A.contiguous_group_ids(N * G, G), num_groups=N)
    pg, m = A.ppo_policy_loss(logp_bt=logp_bt, proximal_logp_bt=proximal_bt,
                              advantages_bt=adv_bt, loss_mask_bt=mask_bt,
                              behaviour_logp_bt=behaviour_bt, clip_eps_low=0.2,
                              clip_eps_high=0.28, off_policy=off_policy, is_cap=5.0)
    kl, _ = A.kl_loss(logp_bt=logp_bt, ref_logp_bt=jnp.full_like(logp_bt, -jnp.log(V)),
                      loss_mask_bt=mask_bt)
    ent, em = A.entropy_bonus(logits_btv=logits_btv, loss_mask_bt=mask_bt, coef=1e-3)
    return pg + 1e-3 * kl + ent, {**m, **em}


@functools.partial(jax.jit, static_argnames="off_policy")
def _train_step(theta, ids_bt, behaviour_bt, rewards_b, mask_bt, *, off_policy):
    proximal_bt = A.gather_logprobs(jnp.broadcast_to(theta, ids_bt.shape + (V,)), ids_bt)
    grad, metrics = jax.grad(_loss, has_aux=True)(theta, ids_bt, behaviour_bt, proximal_bt,
                                                  rewards_b, mask_bt, off_policy)
    return theta - 2.0 * grad, metrics


@jax.jit
def _sample(key, behaviour_theta):
    ids = jax.random.categorical(key, behaviour_theta, shape=(N * G, 2))
    behaviour = A.gather_logprobs(jnp.broadcast_to(behaviour_theta, ids.shape + (V,)), ids)
    return ids, behaviour, (ids[:, 0] == GOOD).astype(jnp.float32)


@pytest.mark.parametrize("staleness,off_policy", [(0, "none"), (2, "decoupled"),
                                                  (2, "tis")])
def test_bandit_learns_with_and_without_staleness(staleness, off_policy):
    key = jax.random.key(0)
    theta = jnp.zeros(V)
    history = [theta] * (staleness + 1)
    mask = jnp.ones((N * G, 2)).at[:, 1].set(0.0)  # one trained token + one padding column
    for step in range(40):
        ids, behaviour, rewards = _sample(jax.random.fold_in(key, step),
                                          history[-(staleness + 1)])
        theta, metrics = _train_step(theta, ids, behaviour, rewards, mask,
                                     off_policy=off_policy)
        history.append(theta)
        finite = jnp.all(jnp.stack([jnp.isfinite(v) for v in metrics.values()]))
        assert bool(finite)
    assert float(jax.nn.softmax(theta)[GOOD]) > 0.9
