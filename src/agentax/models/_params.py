"""The Hugging Face tensor name <-> NNX parameter path table of each family (bonsai style).

A Hugging Face `nn.Linear` weight is [out, in]; an NNX `Linear.kernel` is [in, out], so those
tensors are transposed on the way in and out. Embeddings ([V, D]), norm weights and biases keep
their layout.
"""

from __future__ import annotations

import dataclasses
import re

from agentax.models._config import ModelConfig

__all__ = ["ParamSpec", "hf_param_table", "is_ignorable_hf_tensor", "TEXT_PREFIXES"]

NnxPath = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParamSpec:
    """Where one Hugging Face tensor lives in the NNX `Transformer`."""

    path: NnxPath
    """Path in `nnx.state(model, nnx.Param)`, e.g. ('layers', 0, 'attn', 'q_proj', 'kernel')."""
    transpose: bool
    """True for Linear weights: HF [out, in] <-> NNX kernel [in, out]."""


TEXT_PREFIXES = ("model.", "model.language_model.", "language_model.model.")
"""Prefixes of the decoder tensors: CausalLM files, then Gemma3ForConditionalGeneration files
written by transformers 5 and by transformers 4."""

_LM_HEAD = {
    "model.": "lm_head.weight",
    "model.language_model.": "lm_head.weight",
    "language_model.model.": "language_model.lm_head.weight",
}

# per-layer names: HF suffix after `layers.{i}.` -> (NNX path after ('layers', i), transpose)
_ATTN = {
    f"self_attn.{p}_proj.weight": (("attn", f"{p}_proj", "kernel"), True) for p in "qkvo"
}
_MLP = {
    f"mlp.{p}_proj.weight": (("mlp", f"{p}_proj", "kernel"), True)
    for p in ("gate", "up", "down")
}


def _layer_names(config: ModelConfig) -> dict[str, tuple[NnxPath, bool]]:
    names = {**_ATTN, **_MLP, "input_layernorm.weight": (("attn_norm", "weight"), False)}
    if config.post_norms:  # Gemma 3: four norms per block
        names["post_attention_layernorm.weight"] = (("attn_post_norm", "weight"), False)
        names["pre_feedforward_layernorm.weight"] = (("mlp_norm", "weight"), False)
        names["post_feedforward_layernorm.weight"] = (("mlp_post_norm", "weight"), False)
    else:
        names["post_attention_layernorm.weight"] = (("mlp_norm", "weight"), False)
    if config.qk_norm:
        names["self_attn.q_norm.weight"] = (("attn", "q_norm", "weight"), False)
        names["self_attn.k_norm.weight"] = (("attn", "k_norm", "weight"), False)
    if config.qkv_bias:
        for p in "qkv":
            names[f"self_attn.{p}_proj.bias"] = (("attn", f"{p}_proj", "bias"), False)
    if config.o_bias:
        names["self_attn.o_proj.bias"] = (("attn", "o_proj", "bias"), False)
    if config.mlp_bias:
        for p in ("gate", "up", "down"):
            names[f"mlp.{p}_proj.bias"] = (("mlp", f"{p}_proj", "bias"), False)
    return names


def hf_param_table(config: ModelConfig, prefix: str = "model.") -> dict[str, ParamSpec]:
    """Every tensor name of a Hugging Face checkpoint of `config` -> its `ParamSpec`.

    Args:
      config: the model's config (decides norms, biases, qk-norm and the lm_head).
      prefix: the decoder prefix, one of `TEXT_PREFIXES`.
    """
    table = {
        f"{prefix}embed_tokens.weight": ParamSpec(path=("embed", "embedding"), transpose=False),
        f"{prefix}norm.weight": ParamSpec(path=("final_norm", "weight"), transpose=False),
    }
    layer_names = _layer_names(config)
    for i in range(config.num_layers):
        for suffix, (path, transpose) in layer_names.items():
            table[f"{prefix}layers.{i}.{suffix}"] = ParamSpec(
                path=("layers", i, *path), transpose=transpose
            )
    if not config.tie_word_embeddings:
        table[_LM_HEAD[prefix]] = ParamSpec(path=("lm_head", "kernel"), transpose=True)
    return table


_IGNORABLE = (
    re.compile(r".*\.rotary_emb\.inv_freq$"),  # RoPE buffer saved by old transformers versions
    re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\."),  # Gemma 3 vision half
)


def is_ignorable_hf_tensor(name: str, config: ModelConfig, prefix: str = "model.") -> bool:
    """True for tensors a checkpoint may carry that the text model does not use.

    These are RoPE `inv_freq` buffers (recomputed from the config), Gemma 3's vision tower and
    projector, and an `lm_head.weight` kept beside tied embeddings (transformers ignores it too).
    """
    if config.tie_word_embeddings and name == _LM_HEAD[prefix]:
        return True
    return any(p.match(name) for p in _IGNORABLE)
