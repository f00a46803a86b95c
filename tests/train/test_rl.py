"""RLTrainer: the jitted step on real groups, its equivalences, algorithms and bad input."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentax import algos
from agentax.config import ConfigError
from agentax.models import Transformer
from agentax.records import Group
from agentax.train import NonFiniteUpdateError, RLTrainer, TrainerConfig
from tests.train.conftest import MICRO, base_config, make_groups, make_model, make_traj


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_step_trains_and_reports(model):
    groups = make_groups(seed=1, version=-2)
    trainer = RLTrainer(model, base_config())
    before = _leaves(trainer._params)
    m = trainer.step(groups)
    assert not m.skipped and m.step == 1 and m.policy_version == trainer.policy_version == 1
    assert any(not np.allclose(a, b) for a, b in zip(before, _leaves(trainer._params)))
    trajs = [t for g in groups for t in g.trajectories]
    assert m.num_tokens == sum(int(t.loss_mask[1:].sum()) for t in trajs)
    assert m.num_sequences == 8 and m.num_groups == 2
    assert trainer.data_position == 2
    # Tokens were sampled by version -2 and trained at version 0.
    assert m.staleness_mean == 2.0 and m.staleness_max == 2
    # Advantages come from agentax.algos GRPO on the groups' rewards, token-weighted.
    adv = np.asarray(algos.grpo_advantages(np.stack([g.rewards for g in groups])))
    gen = np.array([[t.loss_mask[1:].sum() for t in g.trajectories] for g in groups])
    assert m.advantage_abs_mean == pytest.approx((np.abs(adv) * gen).sum() / gen.sum(), rel=1e-5)
    # On-policy PPO: ratio 1, loss = -token-mean advantage, nothing clipped.
    assert m.pg_loss == pytest.approx(-(adv * gen).sum() / gen.sum(), abs=1e-5)
    assert m.extra["ratio_mean"] == pytest.approx(1.0) and m.clip_frac_high == 0.0
    assert 0 < m.entropy < np.log(MICRO.vocab_size) + 1e-3 and m.grad_norm > 0
    m2 = trainer.step(make_groups(seed=1, version=0))
    assert m2.policy_version == 2 and m2.staleness_mean == 1.0


def test_packed_and_accumulated_step_equals_plain_step(model):
    groups = make_groups(seed=2, num_groups=3)
    plain = RLTrainer(model, base_config())
    packed = RLTrainer(model, base_config(micro_batch_size=2, pack=True, pack_length=32))
    a, b = plain.step(groups), packed.step(groups)
    assert b.num_micro_batches > 1 and b.num_positions < a.num_positions
    assert a.num_tokens == b.num_tokens
    assert b.loss == pytest.approx(a.loss, abs=1e-5)
    assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
    assert b.entropy == pytest.approx(a.entropy, rel=1e-4)
    # Adam turns a near-zero gradient into a step of about +-lr, so float noise in such an
    # element moves it by up to ~lr; 1e-4 is 1% of lr=1e-2.
    for x, y in zip(_leaves(plain._params), _leaves(packed._params)):
        np.testing.assert_allclose(x, y, atol=1e-4)


def test_compilations_stay_bounded_over_varied_steps(model):
    trainer = RLTrainer(model, base_config())
    for i in range(8):
        m = trainer.step(make_groups(seed=10 + i, num_groups=1 + i % 3))
        assert not m.skipped
    kernels = trainer.compiles_by_kernel
    # All sequences fit the 32 bucket and rows come in fours: one train-step shape.
    assert kernels["accumulate_grads"] == 1 and kernels["apply_update"] == 1
    assert kernels["compute_advantages"] <= 3  # 4, 8, 16 padded sequences
    assert trainer.num_compiles == sum(kernels.values())


def test_bad_input_is_an_error_or_a_counted_behaviour(model):
    trainer = RLTrainer(model, base_config())
    with pytest.raises(ValueError, match="no groups"):
        trainer.step([])
    with pytest.raises(TypeError, match="Group"):
        trainer.step([make_groups()[0].trajectories[0]])
    with pytest.raises(ValueError, match="no trajectories"):
        trainer.step([Group(group_id="e", task_id="e", trajectories=())])

    # A NaN reward: that sample is left out (counted), the update stays finite.
    g = make_groups(seed=3, num_groups=1)[0]
    bad = dataclasses.replace(g.trajectories[0], reward=float("nan"))
    m = trainer.step([dataclasses.replace(g, trajectories=(bad,) + g.trajectories[1:])])
    assert m.invalid_sequences == 1 and not m.skipped and np.isfinite(m.loss)
    assert all(np.isfinite(x).all() for x in _leaves(trainer._params))

    # Nothing generated: a skipped step, counted, no version bump.
    rng = np.random.default_rng(0)
    prompt_only = Group(group_id="p", task_id="p",
                        trajectories=tuple(make_traj(rng, 10, 0, 1.0) for _ in range(2)))
    v = trainer.policy_version
    m = trainer.step([prompt_only])
    assert m.skipped and m.skip_reason == "no trained tokens"
    assert trainer.policy_version == v and trainer.num_skipped_steps == 1

    # A group of size 1 has no baseline: advantage 0, so the policy gradient is 0.
    singles = [Group(group_id=f"s{i}", task_id="s", trajectories=(make_traj(rng, 4, 6, 1.0),))
               for i in range(4)]
    m = trainer.step(singles)
    assert m.advantage_abs_mean == 0.0 and m.grad_norm == 0.0


def _with_tail(traj, n, rng):
    """`traj` followed by `n` untrained tokens (an episode's final observation)."""
    return dataclasses.replace(
        traj, token_ids=np.r_[traj.token_ids, rng.integers(0, 256, n)].astype(np.int32),
        loss_mask=np.r_[traj.loss_mask, np.zeros(n, np.int8)],
        logprobs=np.r_[traj.logprobs, np.zeros(n, np.float32)],
        versions=np.r_[traj.versions, np.full(n, -1, np.int32)])


def test_untrained_tails_cost_nothing_and_cut_trained_tokens_are_counted(model, caplog):
    rng = np.random.default_rng(5)
    groups = make_groups(seed=4, num_groups=2)
    # Tails of 40-80 tokens take every sequence past max_seq_len=64: nothing trained is lost.
    tailed = [dataclasses.replace(g, trajectories=tuple(
        _with_tail(t, int(rng.integers(40, 80)), rng) for t in g.trajectories)) for g in groups]
    a = RLTrainer(model, base_config()).step(groups)
    b = RLTrainer(model, base_config()).step(tailed)
    assert b.truncated_sequences == 0 and b.num_positions == a.num_positions
    assert b.num_tokens == a.num_tokens and b.loss == pytest.approx(a.loss, abs=1e-6)
    assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
    # Trained tokens past the limit are left out, counted and logged (once) with the fix.
    long = Group(group_id="l", task_id="l", trajectories=(
        make_traj(rng, 10, 70, 1.0), make_traj(rng, 10, 20, 0.0)))
    trainer = RLTrainer(model, base_config())
    with caplog.at_level("WARNING", logger="agentax.train._base"):
        m = trainer.step([long])
        trainer.step([long])
    assert m.truncated_sequences == 1 and m.num_tokens == (64 + 1 - 10) + 20  # 65 tokens kept
    assert caplog.text.count("beyond the trainer's max_seq_len=64") == 1
    assert "raise max_seq_len to 79" in caplog.text


@pytest.mark.parametrize("on_nonfinite", ["skip", "stop"])
def test_non_finite_logits_skip_the_update(model, on_nonfinite):
    trainer = RLTrainer(model, base_config(on_nonfinite=on_nonfinite))
    emb = trainer._params["model"]["embed"]["embedding"]
    emb.value = emb.value.at[7].set(jnp.nan)  # any sequence with token 7 gives NaN logits
    before = _leaves(trainer._params)
    rng = np.random.default_rng(4)
    ids = np.full(12, 7, np.int32)
    g = Group(group_id="n", task_id="n", trajectories=(
        make_traj(rng, 4, 8, 1.0, token_ids=ids), make_traj(rng, 4, 8, 0.0)))
    if on_nonfinite == "stop":
        with pytest.raises(NonFiniteUpdateError, match="on_nonfinite=skip"):
            trainer.step([g])
    else:
        m = trainer.step([g])
        assert m.skipped and m.skip_reason == "non-finite loss or gradients"
    assert trainer.policy_version == 0 and trainer.num_skipped_steps == 1
    for x, y in zip(before, _leaves(trainer._params)):
        np.testing.assert_array_equal(x, y)  # (NaN row included: equal_nan by default)


def test_gae_value_head_kl_and_decoupled_ppo_epochs(model):
    cfg = base_config(advantage="gae", advantage_kwargs={"gamma": 1.0, "lam": 0.95},
                      kl_coef=0.1, ppo_epochs=2, off_policy="decoupled", is_cap=5.0,
                      entropy_coef=1e-3, clip_eps_high=0.28)
    trainer = RLTrainer(model, cfg)
    groups = make_groups(seed=5)
    m1 = trainer.step(groups)
    assert m1.policy_version == 2 and m1.step == 2  # two PPO epochs = two updates
    assert m1.kl == 0.0  # the reference is the initial policy
    for key in ("vf_loss", "explained_variance", "is_weight_mean", "behaviour_kl"):
        assert key in m1.extra and np.isfinite(m1.extra[key])
    assert m1.extra["vf_loss"] > 0  # zero-initialised values vs nonzero returns
    m2 = trainer.step(groups)
    assert m2.kl > 0
    assert trainer.compiles_by_kernel["score_tokens"] == 2  # proximal/values + reference


def test_precompiled_trainer_takes_later_weights_and_steps_without_compiling(model):
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **_: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    # kl_coef > 0: the default reference must follow the loaded weights. clip_eps_low is
    # unique to this test, so no other test compiled these kernels.
    cfg = base_config(kl_coef=0.1, clip_eps_low=0.123)
    later = make_model(3)
    early = RLTrainer(model, cfg)
    early.precompile(make_groups(seed=8))  # any groups of the same shapes
    assert compiles and early.step_count == early.data_position == 0
    early.load_weights(later)
    before = len(compiles)
    m = early.step(make_groups(seed=9))
    assert len(compiles) == before  # the step ran on the precompiled kernels
    direct = RLTrainer(later, cfg)
    d = direct.step(make_groups(seed=9))
    assert m.kl == d.kl == 0.0  # the reference is the loaded policy, not the first one
    assert (m.loss, m.grad_norm, m.policy_version) == (d.loss, d.grad_norm, d.policy_version)
    for x, y in zip(_leaves(early._params), _leaves(direct._params)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="architecture"):
        early.load_weights(Transformer(dataclasses.replace(MICRO, num_layers=2)))


def test_params_for_engine_is_a_plain_state_on_fresh_buffers(model):
    trainer = RLTrainer(model, base_config())
    trainer.step(make_groups(seed=6))
    state = trainer.params_for_engine()
    assert jax.tree.structure(state) == jax.tree.structure(nnx.state(model, nnx.Param))
    engine_model = nnx.merge(nnx.split(make_model(1))[0], state)
    ids = jnp.arange(20, dtype=jnp.int32)[None] % 200
    want = trainer.model(ids)
    trainer.step(make_groups(seed=7))  # donates the trainer's buffers, not the published ones
    np.testing.assert_allclose(engine_model(ids), want, atol=1e-6)
    assert jax.tree.leaves(trainer.params_for_engine(jnp.bfloat16))[0].dtype == jnp.bfloat16
    # The caller's model was copied, not donated.
    assert np.isfinite(np.asarray(model(ids))).all()


@pytest.mark.parametrize("kwargs,match", [
    (dict(pack=True, policy_loss="gspo", off_policy="none"), "pack=True"),
    (dict(advantage="grop"), "did you mean 'grpo'"),
    (dict(kl_in_reward=True, kl_coef=0.1), "token-level estimator"),
    (dict(policy_loss="gspo", off_policy="tis"), "gspo"),
    (dict(agg_mode="token_mean"), "agg_mode"),
])
def test_config_rejects_combinations_it_cannot_honour(kwargs, match):
    with pytest.raises((ConfigError, ValueError), match=match):
        TrainerConfig(**kwargs)
