"""Group and reward shaping: DAPO dynamic sampling filter, DAPO overlong penalty, and the
host-side finite-reward check.

`dynamic_sampling_keep_mask` and `check_finite_rewards` are host-side NumPy (they decide
which groups enter a batch, before anything is placed on device); `overlong_penalty` is
jnp and works both on host arrays and inside jit.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def dynamic_sampling_keep_mask(rewards_ng, valid_ng=None, *, atol: float = 0.0) -> np.ndarray:
    """DAPO dynamic sampling (Yu et al. 2025): keep only groups whose rewards differ.

    A group whose valid rewards are all equal (all correct or all wrong) has zero advantage
    under GRPO-style estimators and only dilutes the batch. Departure: a group with fewer than
    two valid samples is dropped as well (it has no baseline). DAPO then over-samples until
    the batch is full; that is the pipeline's job, this only returns the mask.

    Args:
      rewards_ng: [N, G] rewards (host array).
      valid_ng: [N, G] optional validity mask.
      atol: rewards within atol of each other count as equal.
    Returns:
      [N] bool NumPy array, True for groups to keep.
    """
    r = np.asarray(rewards_ng, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"rewards_ng must be [N, G], got shape {r.shape}")
    v = np.ones(r.shape, bool) if valid_ng is None else np.asarray(valid_ng).astype(bool)
    hi = np.where(v, r, -np.inf).max(axis=1)
    lo = np.where(v, r, np.inf).min(axis=1)
    return (v.sum(axis=1) >= 2) & ((hi - lo) > atol)


def overlong_penalty(lengths_b, *, max_len: int, cache_len: int, factor: float = 1.0):
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13), a reward term <= 0 to add.

        0                                        if L <= max_len - cache_len
        ((max_len - cache_len) - L) / cache_len  if max_len - cache_len < L <= max_len
        -1                                       if L > max_len
    scaled by `factor`. Args: lengths_b [B] generated lengths. Returns [B] float32.
    """
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(f"cache_len must be in (0, max_len]; got cache_len={cache_len}, "
                         f"max_len={max_len}")
    length = jnp.asarray(lengths_b, jnp.float32)
    soft = max_len - cache_len
    pen = jnp.where(length <= soft, 0.0, (soft - length) / cache_len)
    pen = jnp.where(length > max_len, -1.0, pen)
    return factor * pen


def check_finite_rewards(rewards, *, what: str = "rewards") -> None:
    """Raise ValueError naming the positions if any reward is NaN or inf (host side).

    Call it before advantages are computed: a single NaN reward would make a whole group's
    GRPO statistics NaN. Invalid samples should be masked out (valid mask), not set to NaN.
    """
    r = np.asarray(rewards, dtype=np.float64)
    bad = np.argwhere(~np.isfinite(r))
    if bad.size:
        shown = ", ".join(str(tuple(int(i) for i in idx)) for idx in bad[:8])
        more = f" (and {len(bad) - 8} more)" if len(bad) > 8 else ""
        raise ValueError(f"{what} contain {len(bad)} non-finite value(s) at index {shown}"
                         f"{more}; fix the reward function, or mark those samples invalid "
                         "instead of giving them NaN/inf")
