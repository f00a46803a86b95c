"""Optax AdamW with linear warmup + cosine decay and global-norm clipping, from a TrainerConfig."""

from __future__ import annotations

import functools

import jax
import optax

from agentax.train._config import TrainerConfig

__all__ = ["make_optimizer", "make_schedule"]


def make_schedule(config: TrainerConfig) -> optax.Schedule:
    """Learning rate per optimizer update: linear warmup, then cosine decay (or constant)."""
    return _schedule(config.learning_rate, config.warmup_steps, config.decay_steps,
                     config.min_lr_ratio)


def _schedule(peak, warmup_steps, decay_steps, min_lr_ratio) -> optax.Schedule:
    if decay_steps > 0:
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0 if warmup_steps else peak, peak_value=peak,
            warmup_steps=warmup_steps, decay_steps=warmup_steps + decay_steps,
            end_value=peak * min_lr_ratio)
    if warmup_steps > 0:
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, warmup_steps), optax.constant_schedule(peak)],
            [warmup_steps])
    return optax.constant_schedule(peak)


def _decay_mask(params):
    # Decay matrices only: norms and biases are 1-D and should not shrink towards 0.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: TrainerConfig) -> optax.GradientTransformation:
    """clip_by_global_norm (optional) -> AdamW(schedule) with matrix-only weight decay.

    Equal hyper-parameters give the *same* object, so trainers built with equal configs share
    the compiled update kernel (the transformation is a static jit argument).
    """
    c = config
    return _cached_optimizer(c.learning_rate, c.warmup_steps, c.decay_steps, c.min_lr_ratio,
                             c.weight_decay, c.adam_b1, c.adam_b2, c.adam_eps, c.max_grad_norm)


@functools.lru_cache(maxsize=32)
def _cached_optimizer(lr, warmup_steps, decay_steps, min_lr_ratio, weight_decay, b1, b2, eps,
                      max_grad_norm) -> optax.GradientTransformation:
    adamw = optax.adamw(
        learning_rate=_schedule(lr, warmup_steps, decay_steps, min_lr_ratio), b1=b1, b2=b2,
        eps=eps, weight_decay=weight_decay, mask=_decay_mask)
    if max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), adamw)
