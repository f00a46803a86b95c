"""`ModelConfig`: the one description of every supported decoder-only transformer family.

One model implementation serves Llama 3, Qwen2/2.5, Qwen3 and Gemma 3 text models; the
families differ only through the switches below. Presets give real sizes (checked against
the published parameter counts with `jax.eval_shape`) and the tiny CPU default.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["ModelConfig", "RopeScaling", "BYTE_VOCAB_SIZE"]

BYTE_VOCAB_SIZE = 272
"""Vocabulary of `agentax.text.ByteTokenizer`: 256 bytes + 16 special ids."""

LayerType = Literal["full", "sliding"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """RoPE frequency scaling (applied to global-attention layers)."""

    kind: Literal["llama3", "linear"]
    """'llama3' (Llama 3.1 wavelength-dependent scaling) or 'linear' (positions / factor)."""
    factor: float = 8.0
    """Scaling factor."""
    low_freq_factor: float = 1.0
    """llama3 only: wavelengths above original_max / low_freq_factor are scaled fully."""
    high_freq_factor: float = 4.0
    """llama3 only: wavelengths below original_max / high_freq_factor are not scaled."""
    original_max_position_embeddings: int = 8192
    """llama3 only: the context length the model was pre-trained with."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a decoder-only transformer. Every field changes the math."""

    family: Literal["llama", "qwen2", "qwen3", "gemma3"] = "qwen3"
    """Which Hugging Face family this mirrors (decides checkpoint names, not the math)."""
    vocab_size: int = BYTE_VOCAB_SIZE
    """Number of token ids."""
    hidden_size: int = 128
    """Model width D."""
    intermediate_size: int = 384
    """Width of the gated MLP."""
    num_layers: int = 4
    """Number of transformer blocks L."""
    num_heads: int = 4
    """Query heads N."""
    num_kv_heads: int = 2
    """Key/value heads K (grouped-query attention; N must be a multiple of K)."""
    head_dim: int = 32
    """Per-head width H (may differ from hidden_size / num_heads)."""
    rms_norm_eps: float = 1e-6
    """Epsilon inside every RMSNorm."""
    norm_plus_one: bool = False
    """Gemma: RMSNorm scales by (1 + w) with w initialised at 0."""
    qk_norm: bool = True
    """Qwen3/Gemma 3: RMSNorm over each head of q and k before RoPE."""
    post_norms: bool = False
    """Gemma 3: extra RMSNorm after attention and after the MLP (before the residual add)."""
    embed_scale: bool = False
    """Gemma: multiply embeddings by sqrt(hidden_size)."""
    qkv_bias: bool = False
    """Bias on q, k and v projections (Qwen2; Llama with attention_bias)."""
    o_bias: bool = False
    """Bias on the attention output projection (Llama with attention_bias)."""
    mlp_bias: bool = False
    """Bias on the MLP projections (Llama mlp_bias)."""
    hidden_act: Literal["silu", "gelu_tanh", "gelu"] = "silu"
    """Activation of the gate branch (SwiGLU = silu, GeGLU = gelu_tanh)."""
    rope_theta: float = 10000.0
    """RoPE base of global-attention layers."""
    rope_local_theta: float | None = None
    """RoPE base of sliding-window layers (Gemma 3's rope_local_base_freq); None = rope_theta."""
    rope_scaling: RopeScaling | None = None
    """Frequency scaling of global-attention layers."""
    rope_local_scaling: RopeScaling | None = None
    """Frequency scaling of sliding-window layers (rare)."""
    query_scale: float | None = None
    """Multiplier of q before q.k; None = head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)."""
    sliding_window: int | None = None
    """Window of sliding layers: a query at p sees keys at p - window < k <= p."""
    layer_types: tuple[LayerType, ...] | None = None
    """Per layer 'full' or 'sliding'; None = all full."""
    attn_logit_softcap: float | None = None
    """tanh soft-capping of attention logits (Gemma 2 style)."""
    final_logit_softcap: float | None = None
    """tanh soft-capping of output logits."""
    tie_word_embeddings: bool = True
    """Output projection shares the embedding matrix."""
    max_position_embeddings: int = 2048
    """Longest context the model was built for (informational; RoPE uses positions directly)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype (activations, KV cache)."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Storage dtype of parameters."""

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(
                    f"layer_types has {len(self.layer_types)} entries, expected num_layers="
                    f"{self.num_layers}"
                )
            bad = sorted(set(self.layer_types) - {"full", "sliding"})
            if bad:
                raise ValueError(f"layer_types entries must be 'full' or 'sliding', got {bad}")
            if "sliding" in self.layer_types and not self.sliding_window:
                raise ValueError("layer_types has 'sliding' layers but sliding_window is not set")

    # ------------------------------------------------------------------ derived

    def layer_type(self, i: int) -> LayerType:
        return "full" if self.layer_types is None else self.layer_types[i]

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_type(i) == "sliding" else None

    def layer_rope(self, i: int) -> tuple[float, RopeScaling | None]:
        if self.layer_type(i) == "sliding" and self.rope_local_theta is not None:
            return self.rope_local_theta, self.rope_local_scaling
        return self.rope_theta, self.rope_scaling

    @property
    def q_scale(self) -> float:
        return self.query_scale if self.query_scale is not None else self.head_dim**-0.5

    # ------------------------------------------------------------------ presets

    @classmethod
    def tiny(cls, **overrides) -> "ModelConfig":
        """~0.9M parameters, byte vocabulary: the CPU demo and test default (Qwen3 layout)."""
        return cls(**overrides)

    @classmethod
    def small(cls, **overrides) -> "ModelConfig":
        """~20M parameters, byte vocabulary: the benchmark preset for CPU."""
        base = dict(
            hidden_size=384, intermediate_size=1024, num_layers=12, num_heads=6,
            num_kv_heads=2, head_dim=64,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def qwen2_5_0_5b(cls, **overrides) -> "ModelConfig":
        """Qwen2.5-0.5B (494M parameters)."""
        base = dict(
            family="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
            num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6,
            qk_norm=False, qkv_bias=True, rope_theta=1000000.0, tie_word_embeddings=True,
            max_position_embeddings=32768, dtype="bfloat16", param_dtype="bfloat16",
        )
        return cls(**{**base, **overrides})

    @classmethod
    def qwen3_0_6b(cls, **overrides) -> "ModelConfig":
        """Qwen3-0.6B (0.6B parameters, 0.44B without embeddings)."""
        base = dict(
            family="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
            num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6,
            qk_norm=True, rope_theta=1000000.0, tie_word_embeddings=True,
            max_position_embeddings=40960, dtype="bfloat16", param_dtype="bfloat16",
        )
        return cls(**{**base, **overrides})

    @classmethod
    def llama3_2_1b(cls, **overrides) -> "ModelConfig":
        """Llama-3.2-1B (1.24B parameters)."""
        base = dict(
            family="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
            num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5,
            qk_norm=False, rope_theta=500000.0,
            rope_scaling=RopeScaling(
                kind="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
            tie_word_embeddings=True, max_position_embeddings=131072,
            dtype="bfloat16", param_dtype="bfloat16",
        )
        return cls(**{**base, **overrides})

    @classmethod
    def _gemma3(cls, **overrides) -> "ModelConfig":
        n = overrides["num_layers"]
        pattern = tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(n))
        base = dict(
            family="gemma3", vocab_size=262144, rms_norm_eps=1e-6, norm_plus_one=True,
            qk_norm=True, post_norms=True, embed_scale=True, hidden_act="gelu_tanh",
            rope_theta=1000000.0, rope_local_theta=10000.0, query_scale=256**-0.5,
            sliding_window=512, layer_types=pattern, tie_word_embeddings=True,
            max_position_embeddings=32768, dtype="bfloat16", param_dtype="bfloat16",
        )
        return cls(**{**base, **overrides})

    @classmethod
    def gemma3_270m(cls, **overrides) -> "ModelConfig":
        """Gemma-3-270M (268M parameters)."""
        base = dict(
            hidden_size=640, intermediate_size=2048, num_layers=18, num_heads=4,
            num_kv_heads=1, head_dim=256,
        )
        return cls._gemma3(**{**base, **overrides})

    @classmethod
    def gemma3_1b(cls, **overrides) -> "ModelConfig":
        """Gemma-3-1B (1.0B parameters)."""
        base = dict(
            hidden_size=1152, intermediate_size=6912, num_layers=26, num_heads=4,
            num_kv_heads=1, head_dim=256,
        )
        return cls._gemma3(**{**base, **overrides})

    @classmethod
    def preset(cls, name: str, **overrides) -> "ModelConfig":
        """Looks a preset up by name ('tiny', 'small', 'qwen2.5-0.5b', ...)."""
        table = {
            "tiny": cls.tiny,
            "small": cls.small,
            "qwen2.5-0.5b": cls.qwen2_5_0_5b,
            "qwen3-0.6b": cls.qwen3_0_6b,
            "llama3.2-1b": cls.llama3_2_1b,
            "gemma3-270m": cls.gemma3_270m,
            "gemma3-1b": cls.gemma3_1b,
        }
        if name not in table:
            raise ValueError(f"unknown model preset '{name}'; choose one of {sorted(table)}")
        return table[name](**overrides)
