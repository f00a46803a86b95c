"""The policy-loss registry: built-ins by name, a user's own loss in the jitted train step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentax import algos
from agentax.config import ConfigError
from agentax.train import RLTrainer, TrainerConfig
from tests.train.conftest import base_config, make_groups


def _reinforce(*, logp_bt, advantages_bt, loss_mask_bt, agg_mode, agg_norm, global_count, **_):
    """Plain REINFORCE: -A * log pi, no ratio and no clip."""
    mask = jnp.asarray(loss_mask_bt, jnp.float32)
    loss = algos.aggregate_loss(-advantages_bt * logp_bt, mask, mode=agg_mode, norm=agg_norm,
                                global_count=global_count)
    return loss, {"pg_loss": loss, "num_tokens": jnp.sum(mask)}


algos.register_policy_loss("reinforce_test", _reinforce)


def test_builtins_are_registered_with_what_they_support():
    assert algos.POLICY_LOSSES == ("ppo", "gspo")
    assert {"ppo", "gspo", "reinforce_test"} <= set(algos.policy_loss_names())
    ppo, gspo = algos.policy_loss_spec("ppo"), algos.policy_loss_spec("gspo")
    assert ppo.off_policy and ppo.token_level and not gspo.off_policy and not gspo.token_level
    with pytest.raises(ValueError, match="did you mean 'gspo'"):
        algos.policy_loss_spec("gpso")
    with pytest.raises(ValueError, match="already registered"):
        algos.register_policy_loss("ppo", _reinforce)
    with pytest.raises(ValueError, match="callable"):
        algos.register_policy_loss("not_a_loss", 3)


@pytest.mark.parametrize("kwargs,match", [
    (dict(policy_loss="reinforce_test", off_policy="tis"), "no behaviour-policy correction"),
    (dict(policy_loss="reinforce_test", pack=True), "token-level policy_loss"),
    (dict(policy_loss="reinfroce_test"), "did you mean 'reinforce_test'"),
])
def test_the_config_checks_what_a_registered_loss_supports(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TrainerConfig(**kwargs)


def test_a_registered_loss_trains_in_the_jitted_step(model):
    groups = make_groups(seed=3)
    mine = RLTrainer(model, base_config(policy_loss="reinforce_test"))
    ppo = RLTrainer(model, base_config())
    a, b = mine.step(groups), ppo.step(groups)
    assert not a.skipped and a.grad_norm > 0 and np.isfinite(a.loss)
    assert "ratio_mean" not in a.extra and "ratio_mean" in b.extra  # its own metrics
    # On-policy (ratio 1, nothing clipped) PPO's gradient is REINFORCE's: -A * grad log pi.
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    for x, y in zip(jax.tree.leaves(mine._params), jax.tree.leaves(ppo._params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-4)
