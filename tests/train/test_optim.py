"""The optimizer: AdamW whose learning rate is data, so kernels are shared across schedules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentax.train import RLTrainer, SFTTrainer, TrainerConfig
from agentax.train._optim import lr_schedule, make_optimizer, schedule_value
from agentax.train._step import apply_update
from tests.train.conftest import make_groups, make_model


def _schedule_reference(config: TrainerConfig) -> optax.Schedule:
    """The schedule built from optax's own schedules (what agentax used before the lr was data)."""
    peak, warmup, decay = config.learning_rate, config.warmup_steps, config.decay_steps
    if decay > 0:
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0 if warmup else peak, peak_value=peak, warmup_steps=warmup,
            decay_steps=warmup + decay, end_value=peak * config.min_lr_ratio)
    if warmup > 0:
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], [warmup])
    return optax.constant_schedule(peak)


SCHEDULES = [dict(learning_rate=3e-3),
             dict(learning_rate=1e-2, warmup_steps=5),
             dict(learning_rate=2e-4, warmup_steps=4, decay_steps=9, min_lr_ratio=0.1),
             dict(learning_rate=5e-4, decay_steps=7, min_lr_ratio=0.0)]


@pytest.mark.parametrize("kwargs", SCHEDULES)
def test_schedule_is_optax_warmup_then_cosine(kwargs):
    cfg = TrainerConfig(**kwargs)
    want = _schedule_reference(cfg)
    got_host = [float(schedule_value(n, lr_schedule(cfg))) for n in range(20)]
    got_jit = jax.jit(lambda n, p: schedule_value(n, p, xp=jnp))
    got_dev = [float(got_jit(jnp.int32(n), lr_schedule(cfg))) for n in range(20)]
    np.testing.assert_allclose(got_host, [float(want(n)) for n in range(20)], rtol=1e-6)
    np.testing.assert_allclose(got_dev, [float(want(n)) for n in range(20)], rtol=1e-6)


@pytest.mark.parametrize("max_grad_norm", [1.0, None])
def test_update_equals_optax_adamw_with_the_schedule(max_grad_norm):
    cfg = TrainerConfig(learning_rate=1e-2, warmup_steps=3, decay_steps=6, min_lr_ratio=0.2,
                        weight_decay=0.1, max_grad_norm=max_grad_norm)
    reference = optax.adamw(_schedule_reference(cfg), b1=cfg.adam_b1, b2=cfg.adam_b2,
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
                            mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    if max_grad_norm is not None:
        reference = optax.chain(optax.clip_by_global_norm(max_grad_norm), reference)
    tx = make_optimizer(cfg)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
    ref_params, ref_state = params, reference.init(params)
    state = tx.init(params)
    # Same state structure as optax.adamw: checkpoints of either restore into the other.
    assert jax.tree.structure(state) == jax.tree.structure(ref_state)
    ours = jax.tree.map(jnp.copy, params)
    for _ in range(10):
        grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
        upd, ref_state = reference.update(grads, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, upd)
        acc = {"grads": grads, "loss": jnp.zeros((), jnp.float32)}
        ours, state, _, stats = apply_update(ours, state, acc, jnp.float32(1.0),
                                             jnp.asarray(lr_schedule(cfg)), tx=tx)
        assert bool(stats["applied"])
    for k in params:
        np.testing.assert_allclose(ours[k], ref_params[k], rtol=1e-6, atol=1e-7)


def test_sft_then_rl_share_one_compiled_update():
    sft = SFTTrainer(make_model(0), TrainerConfig(learning_rate=1e-2, warmup_steps=5,
                                                  micro_batch_size=8, max_seq_len=64))
    sft.step([(np.arange(30) % 250, np.ones(30))] * 4)
    compiled = apply_update._cache_size()
    rl = RLTrainer(sft.export_model(), TrainerConfig(learning_rate=3e-4, decay_steps=50,
                                                     micro_batch_size=8, max_seq_len=64))
    rl.step(make_groups(0))
    assert rl.step_count == 1
    assert apply_update._cache_size() == compiled  # the RL update reused SFT's kernel
    assert rl.learning_rate == pytest.approx(float(_schedule_reference(rl.config)(1)))
