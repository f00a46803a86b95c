"""Advantage-estimator registry: one keyword signature for every estimator, open to users.

`register_advantage(name, fn, *, group_based=..., needs_values=...)` adds an estimator; the
built-ins (grpo, dr_grpo, rloo, reinforce_pp, gae) are registered the same way below. A
trainer reads what an estimator needs from its `AdvantageSpec`: `needs_values` switches the
value head on, `group_based` makes a run check that groups have more than one sample.

Every registered estimator is called as

    advantages_bt, returns_bt = estimator(
        rewards_b=..., loss_mask_bt=..., group_ids_b=..., valid_b=..., values_bt=...,
        token_rewards_bt=..., num_groups=..., **knobs)

and returns token-level [B, T] arrays (0 on untrained tokens), so a trainer can switch
estimators by name without changing its train step. `returns_bt` is the value-head target
for "gae" and the reward-to-go (a diagnostic) for the critic-free estimators. The call runs
inside `jax.jit` (the estimator name and knobs are static), so an estimator must be traceable.
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdvantageSpec:
    """A registered estimator and what it needs from the trainer."""

    name: str
    fn: AdvantageEstimator
    group_based: bool
    """It compares the samples of a group (needs group_size >= 2 and sampled diversity)."""
    needs_values: bool
    """It reads value-head predictions (`values_bt`): the trainer adds and trains a value head."""


_REGISTRY: dict[str, AdvantageSpec] = {}


def register_advantage(name: str, fn: AdvantageEstimator, *, group_based: bool = False,
                       needs_values: bool = False, replace: bool = False) -> AdvantageEstimator:
    """Registers `fn` as the advantage estimator `name` (e.g. for `trainer.advantage=name`).

    Args:
      name: the registry name.
      fn: called with the keyword signature in this module's docstring; returns
        `(advantages_bt, returns_bt)`, token-level [B, T], 0 on untrained tokens. It runs under
        `jax.jit`.
      group_based: True if it compares samples within a group (GRPO-like).
      needs_values: True if it uses value-head predictions (GAE-like); the trainer then adds a
        value head and trains it on `returns_bt`.
      replace: allow replacing an existing name (otherwise that is an error).
    Returns:
      `fn` (so it can be used as a decorator body).
    Raises:
      ValueError: the name is taken (and not `replace`), or `fn` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"advantage estimator name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise ValueError(f"advantage estimator {name!r} must be callable, got {type(fn).__name__}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"advantage estimator {name!r} is already registered; pass replace=True "
                         "to override it")
    _REGISTRY[name] = AdvantageSpec(name=name, fn=fn, group_based=bool(group_based),
                                    needs_values=bool(needs_values))
    return fn


for _kind in ("grpo", "dr_grpo", "rloo"):
    register_advantage(_kind, _group(_kind), group_based=True)
register_advantage("reinforce_pp", _reinforce_pp)
register_advantage("gae", _gae, needs_values=True)

ADVANTAGE_ESTIMATORS = tuple(_REGISTRY)
"""The built-in estimator names (`advantage_names()` also lists user-registered ones)."""


def advantage_names() -> tuple[str, ...]:
    """Every registered estimator name, built-in and user-registered."""
    return tuple(_REGISTRY)


def advantage_spec(name: str) -> AdvantageSpec:
    """The `AdvantageSpec` registered under `name`.

    Raises:
      ValueError: no estimator has that name (the message names the nearest and the choices).
    """
    return lookup(_REGISTRY, name, "advantage estimator", "register_advantage")


def lookup(registry: dict, name: str, kind: str, register: str):
    """`registry[name]`, or a ValueError naming the nearest name, the choices and `register`."""
    try:
        return registry[name]
    except KeyError:
        near = difflib.get_close_matches(str(name), tuple(registry), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"unknown {kind} {name!r}{hint} (choose one of "
                         f"{', '.join(registry)}, or {register}() your own)") from None


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator function registered under `name`.

    Knobs forwarded as keyword arguments: grpo (eps, std_ddof), dr_grpo / rloo (none),
    reinforce_pp (gamma, eps), gae (gamma, lam, bootstrap_value_b, whiten).
    """
    return advantage_spec(name).fn
