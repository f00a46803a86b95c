"""The jitted loss reads `TrainerConfig` itself (a static jit argument), not a mirrored copy of
its fields, so every loss knob of the config reaches the step."""

from __future__ import annotations

import numpy as np
import pytest

from agentax import algos
from agentax.train import RLTrainer
from tests.train.conftest import base_config, make_groups, make_model


def test_trainer_config_is_a_hashable_static_argument():
    a = base_config(advantage_kwargs={"eps": 1e-3})
    # advantage_kwargs (a dict) is left out of the hash but not out of equality, so two configs
    # that differ only there still get separate jit cache entries.
    assert hash(a) == hash(base_config(advantage_kwargs={"eps": 1e-2}))
    assert a != base_config(advantage_kwargs={"eps": 1e-2})
    assert a == base_config(advantage_kwargs={"eps": 1e-3})


def _advantages_and_lengths(groups):
    adv = np.asarray(algos.grpo_advantages(np.stack([g.rewards for g in groups])))
    gen = np.array([[t.loss_mask[1:].sum() for t in g.trajectories] for g in groups])
    return adv, gen


def test_entropy_coef_and_agg_mode_reach_the_loss():
    groups = make_groups(seed=5)
    adv, gen = _advantages_and_lengths(groups)
    assert not np.isclose(adv.mean(), (adv * gen).sum() / gen.sum())  # the two modes differ here
    config = base_config(entropy_coef=0.5, agg_mode="seq-mean-token-mean")
    m = RLTrainer(make_model(0), config).step(groups)
    # On-policy PPO has ratio 1: the policy loss is minus the aggregated advantage, and with
    # seq-mean-token-mean every sequence weighs the same whatever its length.
    assert m.pg_loss == pytest.approx(-adv.mean(), abs=1e-5)
    assert m.entropy > 0 and m.loss == pytest.approx(m.pg_loss - 0.5 * m.entropy, abs=1e-4)
