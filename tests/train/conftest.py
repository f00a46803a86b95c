"""Shared fixtures of the trainer tests: one micro model config so jitted kernels are reused."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from agentax.models import ModelConfig, Transformer
from agentax.records import Group, Trajectory, TrajectoryStatus

MICRO = ModelConfig.tiny(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=2,
                         num_kv_heads=1, head_dim=16)


def make_model(seed: int = 0) -> Transformer:
    return Transformer(MICRO, rngs=nnx.Rngs(seed))


def make_traj(rng, n_prompt: int, n_gen: int, reward: float, version: int = 0,
              token_ids=None) -> Trajectory:
    n = n_prompt + n_gen
    ids = rng.integers(0, 256, n).astype(np.int32) if token_ids is None else token_ids
    mask = np.r_[np.zeros(n_prompt), np.ones(n_gen)].astype(np.int8)
    lp = np.where(mask > 0, rng.uniform(-6.0, -4.0, n), 0.0).astype(np.float32)
    ver = np.where(mask > 0, version, -1).astype(np.int32)
    return Trajectory(task_id="t", token_ids=ids, loss_mask=mask, logprobs=lp, versions=ver,
                      reward=reward, status=TrajectoryStatus.OK)


def make_groups(seed: int = 0, num_groups: int = 2, group_size: int = 4, version: int = 0,
                max_gen: int = 20) -> list[Group]:
    """Groups of varied lengths (all <= 32 positions) and rewards that differ within a group."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(num_groups):
        trajs = tuple(
            make_traj(rng, int(rng.integers(3, 8)), int(rng.integers(2, max_gen)),
                      float(rng.integers(0, 2)) if j else 1.0 - float(g % 2), version)
            for j in range(group_size))
        out.append(Group(group_id=f"g{g}", task_id=f"t{g}", trajectories=trajs))
    return out


@pytest.fixture
def model():
    return make_model(0)


def base_config(**overrides):
    """The RL config most tests share (same static args -> one compilation for all)."""
    from agentax.train import TrainerConfig
    kw = dict(learning_rate=1e-2, micro_batch_size=4, min_seq_bucket=32, max_seq_len=64)
    return TrainerConfig(**{**kw, **overrides})
