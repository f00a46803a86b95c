"""Policy-loss registry: one keyword signature for every policy loss, open to users.

`register_policy_loss(name, fn, *, off_policy=..., token_level=...)` adds a loss; the
built-ins (ppo, gspo) are registered the same way below, and `TrainerConfig.policy_loss`
names one. Every registered loss is called inside the jitted train step as

    loss, metrics = fn(
        logp_bt=..., proximal_logp_bt=..., behaviour_logp_bt=..., advantages_bt=...,
        loss_mask_bt=..., clip_eps_low=..., clip_eps_high=..., dual_clip_c=...,
        off_policy=..., is_cap=..., agg_mode=..., agg_norm=..., global_count=...)

with [B, T] arrays (`logp_bt` carries the gradient; `behaviour_logp_bt` may be None) and the
trainer's knobs as Python values (static under jit). It returns a scalar loss and a dict of
scalar metrics. A loss ignores the knobs it has no use for; the spec says which runs it
supports, so a config that asks for more fails before compiling.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from agentax.algos._policy import gspo_policy_loss, ppo_policy_loss
from agentax.algos._registry import lookup

PolicyLoss = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyLossSpec:
    """A registered policy loss and what it supports."""

    name: str
    fn: PolicyLoss
    off_policy: bool
    """It applies `off_policy` ('tis' / 'decoupled') with `behaviour_logp_bt`; a loss without
    it runs only with `off_policy='none'`."""
    token_level: bool
    """Its per-token terms need no per-row statistics, so several sequences may share a row
    (`TrainerConfig.pack`)."""


_LOSSES: dict[str, PolicyLossSpec] = {}


def register_policy_loss(name: str, fn: PolicyLoss, *, off_policy: bool = False,
                         token_level: bool = False, replace: bool = False) -> PolicyLoss:
    """Registers `fn` as the policy loss `name` (e.g. for `trainer.policy_loss=name`).

    Args:
      name: the registry name.
      fn: called with the keyword signature in this module's docstring under `jax.jit`;
        returns `(loss, metrics)`.
      off_policy: True if it implements the behaviour-policy correction (`off_policy`).
      token_level: True if it sums per-token terms only (it may train packed rows).
      replace: allow replacing an existing name (otherwise that is an error).
    Returns:
      `fn`.
    Raises:
      ValueError: the name is taken (and not `replace`), empty, or `fn` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy loss name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise ValueError(f"policy loss {name!r} must be callable, got {type(fn).__name__}")
    if name in _LOSSES and not replace:
        raise ValueError(f"policy loss {name!r} is already registered; pass replace=True to "
                         "override it")
    _LOSSES[name] = PolicyLossSpec(name=name, fn=fn, off_policy=bool(off_policy),
                                   token_level=bool(token_level))
    return fn


def _gspo(*, behaviour_logp_bt=None, clip_eps_low, clip_eps_high=None, dual_clip_c=None,
          off_policy="none", is_cap=None, **rest):
    """Registry wrapper around gspo_policy_loss (its clip defaults to symmetric)."""
    del behaviour_logp_bt, dual_clip_c, off_policy, is_cap  # no behaviour-policy correction
    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    return gspo_policy_loss(clip_eps_low=clip_eps_low, clip_eps_high=high, **rest)


register_policy_loss("ppo", ppo_policy_loss, off_policy=True, token_level=True)
register_policy_loss("gspo", _gspo)

POLICY_LOSSES = tuple(_LOSSES)
"""The built-in policy loss names (`policy_loss_names()` also lists user-registered ones)."""


def policy_loss_names() -> tuple[str, ...]:
    """Every registered policy loss name, built-in and user-registered."""
    return tuple(_LOSSES)


def policy_loss_spec(name: str) -> PolicyLossSpec:
    """The `PolicyLossSpec` registered under `name`.

    Raises:
      ValueError: no loss has that name (the message names the nearest and the choices).
    """
    return lookup(_LOSSES, name, "policy loss", "register_policy_loss")
