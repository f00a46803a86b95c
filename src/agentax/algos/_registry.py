"""Advantage-estimator registry: one keyword signature for every estimator.

Every registered estimator is called as

    advantages_bt, returns_bt = estimator(
        rewards_b=..., loss_mask_bt=..., group_ids_b=..., valid_b=..., values_bt=...,
        token_rewards_bt=..., num_groups=..., **knobs)

and returns token-level [B, T] arrays (0 on untrained tokens), so a trainer can switch
estimators by name without changing its train step. `returns_bt` is the value-head target
for "gae" and the reward-to-go (a diagnostic) for the critic-free estimators.
"""

from __future__ import annotations

import difflib
from typing import Callable

import jax
import jax.numpy as jnp

from agentax.algos._advantages import (
    discounted_returns,
    gae_advantages,
    group_advantages_flat,
    place_sequence_reward,
    reinforce_pp_advantages,
)
from agentax.algos._masked import masked_whiten

AdvantageEstimator = Callable[..., tuple[jax.Array, jax.Array]]


def _mask(loss_mask_bt, valid_b):
    mask = jnp.asarray(loss_mask_bt, jnp.float32)
    if valid_b is not None:
        mask = mask * jnp.asarray(valid_b, jnp.float32)[:, None]
    return mask


def _group(kind: str) -> AdvantageEstimator:
    def estimator(*, rewards_b, loss_mask_bt, group_ids_b=None, valid_b=None, values_bt=None,
                  token_rewards_bt=None, num_groups=None, **knobs):
        if group_ids_b is None:
            raise ValueError(f"advantage estimator {kind!r} needs group_ids_b ([B] int ids; "
                             "see contiguous_group_ids)")
        if token_rewards_bt is not None:
            raise ValueError(f"advantage estimator {kind!r} uses one scalar reward per "
                             "sequence; add KL as a loss term (kl_loss) instead of "
                             "token_rewards_bt, or use 'reinforce_pp' / 'gae'")
        del values_bt  # critic-free
        mask = _mask(loss_mask_bt, valid_b)
        adv_b = group_advantages_flat(rewards_b, group_ids_b, valid_b, kind=kind,
                                      num_groups=num_groups, **knobs)
        returns_bt = discounted_returns(place_sequence_reward(rewards_b, mask), mask)
        return adv_b[:, None] * mask, returns_bt

    estimator.__name__ = f"{kind}_estimator"
    estimator.__doc__ = f"Registry wrapper around group_advantages_flat(kind={kind!r})."
    return estimator


def _reinforce_pp(*, rewards_b, loss_mask_bt, group_ids_b=None, valid_b=None, values_bt=None,
                  token_rewards_bt=None, num_groups=None, **knobs):
    """Registry wrapper around reinforce_pp_advantages (group ids and values unused)."""
    del group_ids_b, values_bt, num_groups
    return reinforce_pp_advantages(rewards_b=rewards_b, loss_mask_bt=_mask(loss_mask_bt, valid_b),
                                   token_rewards_bt=token_rewards_bt, **knobs)


def _gae(*, rewards_b, loss_mask_bt, group_ids_b=None, valid_b=None, values_bt=None,
         token_rewards_bt=None, num_groups=None, whiten: bool = False, **knobs):
    """Registry wrapper around gae_advantages; `whiten=True` normalises advantages."""
    del group_ids_b, num_groups
    if values_bt is None:
        raise ValueError("advantage estimator 'gae' needs values_bt ([B, T] value-head "
                         "predictions); use a critic-free estimator such as 'grpo' otherwise")
    mask = _mask(loss_mask_bt, valid_b)
    tok = place_sequence_reward(rewards_b, mask)
    if token_rewards_bt is not None:
        tok = tok + jnp.asarray(token_rewards_bt, jnp.float32)
    adv_bt, ret_bt = gae_advantages(token_rewards_bt=tok, values_bt=values_bt,
                                    loss_mask_bt=mask, **knobs)
    if whiten:
        adv_bt = masked_whiten(adv_bt, mask)
    return adv_bt, ret_bt


_REGISTRY: dict[str, AdvantageEstimator] = {
    "grpo": _group("grpo"),
    "dr_grpo": _group("dr_grpo"),
    "rloo": _group("rloo"),
    "reinforce_pp": _reinforce_pp,
    "gae": _gae,
}
ADVANTAGE_ESTIMATORS = tuple(_REGISTRY)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered under `name` (one of ADVANTAGE_ESTIMATORS).

    Knobs forwarded as keyword arguments: grpo (eps, std_ddof), dr_grpo / rloo (none),
    reinforce_pp (gamma, eps), gae (gamma, lam, bootstrap_value_b, whiten).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        near = difflib.get_close_matches(str(name), ADVANTAGE_ESTIMATORS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"unknown advantage estimator {name!r}{hint} "
                         f"(choose one of {', '.join(ADVANTAGE_ESTIMATORS)})") from None
