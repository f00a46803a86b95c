"""The decoder-only transformer (Flax NNX) shared by every supported family.

Two forward paths:

* `model(input_ids_bt, ...)` — full sequence, for training and scoring. Causal attention,
  optionally restricted by a padding mask or by packed-segment ids.
* the generation engine's cached forwards over a paged KV cache (`_paged.py`:
  `paged_forward` and `paged_decode_step`), which use the pieces of `Attention`
  (`qkv`) and `Block` (`_finish`) defined here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agentax.models._attention import (
    dense_attention_pays,
    resolve_attention_block,
    resolve_attention_impl,
    train_attention,
)
from agentax.models._config import ModelConfig
from agentax.models._layers import RMSNorm, apply_rope, positions_from_segments, rope_inv_freq
from agentax.models._scan import run_layers

__all__ = ["Transformer"]


@functools.lru_cache(maxsize=64)
def _inv_freq(head_dim, theta, scaling):
    return rope_inv_freq(head_dim, theta, scaling)


_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}


def _linear(din, dout, bias, cfg, rngs):
    return nnx.Linear(
        din, dout, use_bias=bias, dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs,
    )


def _norm(dim, cfg, rngs):
    return RMSNorm(
        dim, eps=cfg.rms_norm_eps, plus_one=cfg.norm_plus_one,
        param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs,
    )


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rngs: nnx.Rngs):
        d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = _linear(d, n * h, cfg.qkv_bias, cfg, rngs)
        self.k_proj = _linear(d, k * h, cfg.qkv_bias, cfg, rngs)
        self.v_proj = _linear(d, k * h, cfg.qkv_bias, cfg, rngs)
        self.o_proj = _linear(n * h, d, cfg.o_bias, cfg, rngs)
        self.q_norm = _norm(h, cfg, rngs) if cfg.qk_norm else None
        self.k_norm = _norm(h, cfg, rngs) if cfg.qk_norm else None
        self.num_heads, self.num_kv_heads, self.head_dim = n, k, h
        self.theta, self.scaling = cfg.layer_rope(layer)
        self.window = cfg.layer_window(layer)
        self.scale = cfg.q_scale
        self.softcap = cfg.attn_logit_softcap

    def qkv(self, x_btd: jax.Array, positions_bt: jax.Array, inv_freq=None):
        """Projected, normed and rotated q [B, T, N, H], k and v [B, T, K, H]; `inv_freq`
        overrides this layer's RoPE frequencies (the scanned forward passes them as data)."""
        b, t, _ = x_btd.shape
        q = self.q_proj(x_btd).reshape(b, t, self.num_heads, self.head_dim)  # [B, T, N, H]
        k = self.k_proj(x_btd).reshape(b, t, self.num_kv_heads, self.head_dim)  # [B, T, K, H]
        v = self.v_proj(x_btd).reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if inv_freq is None:
            inv_freq = _inv_freq(self.head_dim, self.theta, self.scaling)
        return apply_rope(q, positions_bt, inv_freq), apply_rope(k, positions_bt, inv_freq), v

    def __call__(self, x_btd, positions_bt, segment_ids_bt, *, inv_freq=None, window=None,
                 impl: str = "blocked", block: int = 512):
        """Full-sequence attention (training and scoring): causal, within segments when
        `segment_ids_bt` is given (0 = padding), over this layer's window unless `window`
        (a traced per-layer value under scan: 0 = none) and `inv_freq` override them."""
        q, k, v = self.qkv(x_btd, positions_bt, inv_freq)
        b, t = positions_bt.shape
        out = train_attention(q, k, v, segment_ids_bt=segment_ids_bt,
                              window=self.window if window is None else window,
                              scale=self.scale, softcap=self.softcap, impl=impl, block=block)
        return self.o_proj(out.reshape(b, t, -1))


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _linear(d, f, cfg.mlp_bias, cfg, rngs)
        self.up_proj = _linear(d, f, cfg.mlp_bias, cfg, rngs)
        self.down_proj = _linear(f, d, cfg.mlp_bias, cfg, rngs)
        self.act = cfg.hidden_act

    def __call__(self, x_btd):
        return self.down_proj(_ACTIVATIONS[self.act](self.gate_proj(x_btd)) * self.up_proj(x_btd))


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rngs: nnx.Rngs):
        self.attn_norm = _norm(cfg.hidden_size, cfg, rngs)
        self.attn = Attention(cfg, layer, rngs)
        self.mlp_norm = _norm(cfg.hidden_size, cfg, rngs)
        self.mlp = MLP(cfg, rngs)
        self.attn_post_norm = _norm(cfg.hidden_size, cfg, rngs) if cfg.post_norms else None
        self.mlp_post_norm = _norm(cfg.hidden_size, cfg, rngs) if cfg.post_norms else None

    def _finish(self, x, a):
        if self.attn_post_norm is not None:
            a = self.attn_post_norm(a)
        x = x + a
        m = self.mlp(self.mlp_norm(x))
        if self.mlp_post_norm is not None:
            m = self.mlp_post_norm(m)
        return x + m

    def __call__(self, x_btd, positions_bt, segment_ids_bt, **attn):
        return self._finish(x_btd, self.attn(self.attn_norm(x_btd), positions_bt, segment_ids_bt,
                                             **attn))


REMAT_AUTO_BYTES = 2 << 30
"""`remat='auto'` keeps every activation (no recomputation) when the layers' saved
activations, estimated from the shapes, fit in this many bytes (2 GiB): below it
recomputing each layer costs a third more compute (20 % of a byte-model recipe's SFT step on
the CPU) to save memory no device is short of; real models at real lengths are far past it
(Qwen3-0.6B, one row of 32k tokens: ~36 GB) and recompute."""

SCAN_AUTO_MIN_LAYERS = 5
"""`scan='auto'` scans the layers of models with at least this many (compile time and kernel
size then stay flat with depth); shallower ones run unrolled (XLA fuses across their few
layers: a 2-layer byte model's step is ~10 % faster on the CPU)."""


def saved_activation_bytes(cfg: ModelConfig, b: int, t: int, impl: str, itemsize: int) -> int:
    """Estimate of what the backward pass of `cfg`'s layers keeps without recomputation, for
    B x T tokens: per layer and token ~10 hidden-sized and 4 MLP-sized vectors (norms,
    projections, residuals, gate/up/activation), plus the float32 scores and probabilities
    [N, T] of the dense attention."""
    per_token = (10 * cfg.hidden_size + 4 * cfg.intermediate_size) * itemsize
    if impl == "dense":
        per_token += 2 * cfg.num_heads * t * 4
    return cfg.num_layers * b * t * per_token


def resolve_layer_options(cfg: ModelConfig, b: int, t: int, impl: str, remat: str,
                          scan: bool | str, itemsize: int) -> tuple[str, bool]:
    """(remat, scan) with 'auto' resolved for B x T tokens (see REMAT_AUTO_BYTES and
    SCAN_AUTO_MIN_LAYERS); explicit choices pass through."""
    if remat == "auto":
        need = saved_activation_bytes(cfg, b, t, impl, itemsize)
        remat = "none" if need <= REMAT_AUTO_BYTES else "full"
    if scan == "auto":
        scan = cfg.num_layers >= SCAN_AUTO_MIN_LAYERS
    return remat, bool(scan)

class Transformer(nnx.Module):
    """Decoder-only transformer; see the module docstring for its two forward paths."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = config
        self.embed = nnx.Embed(
            config.vocab_size, config.hidden_size, dtype=jnp.dtype(config.dtype),
            param_dtype=jnp.dtype(config.param_dtype), rngs=rngs,
        )
        self.layers = nnx.List([Block(config, i, rngs) for i in range(config.num_layers)])
        self.final_norm = _norm(config.hidden_size, config, rngs)
        self.lm_head = (
            None if config.tie_word_embeddings
            else _linear(config.hidden_size, config.vocab_size, False, config, rngs)
        )

    # ------------------------------------------------------------------ pieces

    def embed_tokens(self, ids_bt: jax.Array) -> jax.Array:
        x = self.embed(ids_bt)  # [B, T, D]
        if self.config.embed_scale:
            x = x * jnp.asarray(self.config.hidden_size**0.5, x.dtype)
        return x

    def logits(self, hidden_btd: jax.Array) -> jax.Array:
        """Final-norm hidden states [..., D] -> float32 logits [..., V]."""
        return self.head(hidden_btd.dtype)(hidden_btd)

    def head(self, dtype) -> Callable[[jax.Array], jax.Array]:
        """The LM head as a function of hidden states [..., D] (in `dtype`) -> float32 logits
        [..., V], its weights cast to `dtype` once: a loss that runs the head chunk by chunk
        calls it per chunk without casting the [V, D] table again each time."""
        if self.lm_head is None:
            weight, spec = self.embed.embedding[...].astype(dtype), "...d,vd->...v"  # [V, D]
        else:
            weight, spec = self.lm_head.kernel[...].astype(dtype), "...d,dv->...v"  # [D, V]
        cap = self.config.final_logit_softcap

        def apply(hidden):
            out = jnp.einsum(spec, hidden, weight, preferred_element_type=jnp.float32)
            return out if cap is None else jnp.tanh(out / cap) * cap

        return apply

    # ------------------------------------------------------------------ full sequence

    def hidden(
        self,
        input_ids_bt: jax.Array,
        positions_bt: jax.Array | None = None,
        segment_ids_bt: jax.Array | None = None,
        attention_mask_bt: jax.Array | None = None,
        *,
        remat: str = "none",
        scan: bool | str = True,
        attention: str = "auto",
        attention_block: int = 0,
        activation_sharding=None,
    ) -> jax.Array:
        """Final-norm hidden states [B, T, D] of a full-sequence forward pass.

        Args:
          input_ids_bt: [B, T] int token ids.
          positions_bt: [B, T] RoPE positions; default 0..T-1, or restarting per segment when
            `segment_ids_bt` is given.
          segment_ids_bt: [B, T] packed-sequence ids; tokens attend only within their segment;
            0 marks padding.
          attention_mask_bt: [B, T] 1 for real tokens, 0 for padding (keys masked out).
          remat: 'none', 'full' (each layer recomputed in the backward pass from its input),
            'save_dots' (its matmul outputs kept too) or 'auto' (none when the saved
            activations are small: `REMAT_AUTO_BYTES`, else full).
          scan: run the layers as one `lax.scan` over their stacked weights (one compiled
            layer, whatever the depth); layers of different structure fall back to a loop.
            'auto' scans models of `SCAN_AUTO_MIN_LAYERS` layers or more.
          attention: 'blocked' (O(T x block) memory, masked blocks skipped), 'dense' (the
            [T, T] reference), 'cudnn' (GPU) or 'auto' (see `resolve_attention_impl`).
          attention_block: the blocked attention's block size; 0 picks it
            (`resolve_attention_block`).
          activation_sharding: a sharding the [B, T, D] activations are pinned to at each
            layer (rows over the data axes), or None.
        """
        b, t = input_ids_bt.shape
        seg = segment_ids_bt
        if seg is not None and positions_bt is None:
            positions_bt = positions_from_segments(seg)
        if attention_mask_bt is not None:  # padding keys: a segment of their own, never seen
            real = jnp.asarray(attention_mask_bt).astype(jnp.int32)
            seg = real if seg is None else jnp.asarray(seg, jnp.int32) * real
        if positions_bt is None:
            positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        cfg = self.config
        windows = {cfg.layer_window(i) for i in range(cfg.num_layers)}
        if scan == "auto":
            scan = cfg.num_layers >= SCAN_AUTO_MIN_LAYERS
        impl = resolve_attention_impl(attention, softcap=cfg.attn_logit_softcap,
                                      segmented=seg is not None, dtype=cfg.dtype,
                                      traced_window=scan and len(windows) > 1)
        block = resolve_attention_block(attention_block, cfg.head_dim)
        if attention == "auto" and impl == "blocked" and \
                dense_attention_pays(b, cfg.num_heads, t, block):
            impl = "dense"
        pin = ((lambda x: jax.lax.with_sharding_constraint(x, activation_sharding))
               if activation_sharding is not None else (lambda x: x))
        x = pin(self.embed_tokens(input_ids_bt))
        remat, scan = resolve_layer_options(cfg, b, t, impl, remat, scan, x.dtype.itemsize)
        x = run_layers(list(self.layers), cfg, x, positions_bt, seg, remat=remat, scan=scan,
                       impl=impl, block=block, pin=pin)
        return pin(self.final_norm(x))

    def __call__(
        self,
        input_ids_bt: jax.Array,
        positions_bt: jax.Array | None = None,
        segment_ids_bt: jax.Array | None = None,
        attention_mask_bt: jax.Array | None = None,
        **options,
    ) -> jax.Array:
        """Float32 logits [B, T, V] for int32 `input_ids_bt` [B, T] (see `hidden` for args)."""
        return self.logits(self.hidden(input_ids_bt, positions_bt, segment_ids_bt,
                                       attention_mask_bt, **options))
