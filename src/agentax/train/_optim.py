"""Optax AdamW with linear warmup + cosine decay and global-norm clipping, from a TrainerConfig."""

from __future__ import annotations

import jax
import optax

from agentax.train._config import TrainerConfig

__all__ = ["make_optimizer", "make_schedule"]


def make_schedule(config: TrainerConfig) -> optax.Schedule:
    """Learning rate per optimizer update: linear warmup, then cosine decay (or constant)."""
    peak = config.learning_rate
    if config.decay_steps > 0:
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0 if config.warmup_steps else peak, peak_value=peak,
            warmup_steps=config.warmup_steps,
            decay_steps=config.warmup_steps + config.decay_steps,
            end_value=peak * config.min_lr_ratio)
    if config.warmup_steps > 0:
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, config.warmup_steps), optax.constant_schedule(peak)],
            [config.warmup_steps])
    return optax.constant_schedule(peak)


def _decay_mask(params):
    # Decay matrices only: norms and biases are 1-D and should not shrink towards 0.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: TrainerConfig) -> optax.GradientTransformation:
    """clip_by_global_norm (optional) -> AdamW(schedule) with matrix-only weight decay."""
    adamw = optax.adamw(
        learning_rate=make_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
        eps=config.adam_eps, weight_decay=config.weight_decay, mask=_decay_mask)
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)
