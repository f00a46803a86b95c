"""Building blocks of the transformer: RMSNorm, RoPE, grouped-query attention, gated MLP.

Numerics follow the Hugging Face reference implementations (norms and softmax in float32,
RoPE frequencies computed in float32 the way `transformers` computes them) so that logits
match to 1e-4 in float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentax.models._config import RopeScaling

__all__ = [
    "RMSNorm", "rope_inv_freq", "apply_rope", "attention", "positions_from_segments",
    "MASK_VALUE",
]

MASK_VALUE = float(np.finfo(np.float32).min)


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis; Gemma's variant scales by (1 + w)."""

    def __init__(self, dim: int, *, eps: float, plus_one: bool, param_dtype, rngs: nnx.Rngs):
        del rngs
        init = jnp.zeros if plus_one else jnp.ones
        self.weight = nnx.Param(init((dim,), dtype=param_dtype))
        self.eps = eps
        self.plus_one = plus_one

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = x.dtype
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...].astype(jnp.float32)
        if self.plus_one:
            return (x32 * (1.0 + w)).astype(dtype)
        # Llama/Qwen cast back to the input dtype before the weight multiply.
        return (w * x32.astype(dtype).astype(jnp.float32)).astype(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse frequencies [H/2] (float32), with optional llama3 / linear scaling."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    if scaling.kind == "llama3":
        old_len = scaling.original_max_position_embeddings
        low_wavelen = old_len / scaling.low_freq_factor
        high_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise ValueError(f"unsupported rope scaling kind '{scaling.kind}' (use 'llama3' or 'linear')")


def apply_rope(x_btnh: jax.Array, positions_bt: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotates the two halves of each head by position (HF `rotate_half` convention)."""
    angles = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, H]
    cos = jnp.cos(angles).astype(x_btnh.dtype)
    sin = jnp.sin(angles).astype(x_btnh.dtype)
    half = x_btnh.shape[-1] // 2
    rotated = jnp.concatenate([-x_btnh[..., half:], x_btnh[..., :half]], axis=-1)
    return x_btnh * cos + rotated * sin


def attention(
    q_btnh: jax.Array,
    k_bskh: jax.Array,
    v_bskh: jax.Array,
    mask_bts: jax.Array,
    *,
    scale: float,
    softcap: float | None,
) -> jax.Array:
    """Grouped-query attention with an explicit boolean mask; returns [B, T, N, H].

    Softmax runs in float32. A fully masked row (padding) yields finite garbage, never NaN.
    """
    b, t, n, h = q_btnh.shape
    kv = k_bskh.shape[2]
    q_btkgh = q_btnh.reshape(b, t, kv, n // kv, h)
    scores = jnp.einsum(
        "btkgh,bskh->bkgts", q_btkgh * jnp.asarray(scale, q_btnh.dtype), k_bskh,
        preferred_element_type=jnp.float32,
    )  # [B, K, G, T, S]
    probs = _masked_softmax(scores, mask_bts, softcap, v_bskh.dtype)
    out = jnp.einsum("bkgts,bskh->btkgh", probs, v_bskh)  # [B, T, K, G, H]
    return out.reshape(b, t, n, h)


def _masked_softmax(scores_bkgts: jax.Array, mask_bts: jax.Array, softcap: float | None,
                    dtype) -> jax.Array:
    """Soft-capped, masked float32 softmax over the last axis of [B, K, G, T, S] scores."""
    if softcap is not None:
        scores_bkgts = jnp.tanh(scores_bkgts / softcap) * softcap
    scores_bkgts = jnp.where(mask_bts[:, None, None, :, :], scores_bkgts, MASK_VALUE)
    return jax.nn.softmax(scores_bkgts, axis=-1).astype(dtype)


def positions_from_segments(segment_ids_bt: jax.Array) -> jax.Array:
    """Positions that restart at 0 at each new segment of a packed row (padding = segment 0)."""
    b, t = segment_ids_bt.shape
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    starts = jnp.concatenate(
        [jnp.ones((b, 1), bool), segment_ids_bt[:, 1:] != segment_ids_bt[:, :-1]], axis=1
    )
    start_idx = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
    return idx - start_idx
