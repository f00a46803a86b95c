"""Optax AdamW with linear warmup + cosine decay and global-norm clipping, from a TrainerConfig.

The learning rate is not part of the compiled update: the transformation (`make_optimizer`)
ends in a unit step (-1, the schedule's counter kept in the optimizer state as optax keeps it)
and `apply_update` multiplies by `schedule_value(count, lr_schedule(config))`, computed in the
kernel from four numbers passed as an array. Trainers that differ only in their schedule (the
CLI's SFT warm start and the RL trainer after it) therefore share one compiled update kernel
instead of compiling one each (~1.5 s on 2 CPU cores), and the numbers are optax's own:
`-lr * u`, with lr = optax's warmup / cosine schedule at the same count.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import optax

from agentax.train._config import TrainerConfig

__all__ = ["lr_schedule", "make_optimizer", "schedule_count", "schedule_value"]


def lr_schedule(config: TrainerConfig) -> np.ndarray:
    """The schedule's parameters as float32 [peak, warmup_steps, decay_steps, min_lr_ratio]."""
    c = config
    return np.array([c.learning_rate, c.warmup_steps, c.decay_steps, c.min_lr_ratio], np.float32)


def schedule_value(count, params, xp=np):
    """Learning rate of update number `count` (0-based): linear warmup from 0 to the peak over
    warmup_steps, then a cosine decay to min_lr_ratio x peak over decay_steps (or the peak held
    when decay_steps is 0). The formulas of optax's `linear_schedule` / `cosine_decay_schedule`
    joined at warmup_steps (`warmup_cosine_decay_schedule`); `xp` is numpy on the host and
    jax.numpy inside a kernel.
    """
    peak, warmup, decay, ratio = (params[i] for i in range(4))
    count = xp.asarray(count, np.float32)
    warm_frac = 1.0 - xp.clip(count, 0.0, warmup) / xp.maximum(warmup, 1.0)
    warming = -peak * warm_frac + peak  # optax: (init - end) * frac + end, init = 0
    alpha = xp.where(peak == 0.0, 0.0, ratio)
    done = xp.clip(count - warmup, 0.0, decay)
    cosine = 0.5 * (1.0 + xp.cos(math.pi * done / xp.maximum(decay, 1.0)))
    decayed = peak * ((1.0 - alpha) * cosine + alpha)
    after = xp.where(decay > 0.0, decayed, peak)
    return xp.where((warmup > 0.0) & (count < warmup), warming, after).astype(np.float32)


def schedule_count(opt_state):
    """Updates applied so far: the counter of the unit step at the end of `make_optimizer`."""
    states = [s for s in jax.tree.leaves(
        opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
        if isinstance(s, optax.ScaleByScheduleState)]
    if len(states) != 1:
        raise ValueError("the optimizer state has no single schedule counter; was it made by "
                         "agentax.train's make_optimizer?")
    return states[0].count


def _decay_mask(params):
    # Decay matrices only: norms and biases are 1-D and should not shrink towards 0.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _unit_step(count):
    return -1.0


def make_optimizer(config: TrainerConfig) -> optax.GradientTransformation:
    """clip_by_global_norm (optional) -> AdamW with matrix-only weight decay, without its
    learning rate (see the module docstring): the update is the step's direction, to be
    multiplied by `schedule_value`. The state has optax.adamw's structure (checkpoints of
    either kind restore into the other).

    Equal hyper-parameters give the *same* object, so trainers built with equal configs share
    the compiled update kernel (the transformation is a static jit argument).
    """
    c = config
    return _cached_optimizer(c.weight_decay, c.adam_b1, c.adam_b2, c.adam_eps, c.max_grad_norm)


@functools.lru_cache(maxsize=32)
def _cached_optimizer(weight_decay, b1, b2, eps, max_grad_norm) -> optax.GradientTransformation:
    # optax.adamw is chain(scale_by_adam, add_decayed_weights, scale_by_learning_rate); the
    # last is scale_by_schedule(-lr), here scale_by_schedule(-1).
    adamw = optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay, _decay_mask),
        optax.scale_by_schedule(_unit_step))
    if max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), adamw)
