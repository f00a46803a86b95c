"""Hugging Face `config.json` <-> `ModelConfig`, for Llama 3, Qwen2/2.5, Qwen3 and Gemma 3 text.

Both the transformers-5 layout (`rope_parameters`, per layer type for Gemma 3) and the older
one (`rope_theta` / `rope_scaling` / `rope_local_base_freq`, `sliding_window_pattern`) are read.
A key missing from the file takes the default of that family's `transformers` config class, as
`transformers` itself would.

Every key either changes the math and is honoured, is listed in `IGNORED_HF_FIELDS` with the
reason it does not change the math, or is rejected with an error naming it. Values we cannot
reproduce (rope type 'yarn', bidirectional attention, quantised weights, ...) are rejected too,
so a checkpoint never loads into a model that silently computes something else.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from agentax.models._config import ModelConfig, RopeScaling

__all__ = ["config_from_hf", "config_to_hf", "HF_ARCHITECTURES", "IGNORED_HF_FIELDS"]

HF_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # text tower only, from `text_config`
}
"""`architectures[0]` of a supported config.json -> `ModelConfig.family`."""

_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}
_FAMILY_TO_HF = {  # family -> (architecture, model_type) written by `config_to_hf`
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}

IGNORED_HF_FIELDS: dict[str, str] = {
    "architectures": "read to pick the family",
    "model_type": "read to pick the family when `architectures` is absent",
    "transformers_version": "metadata",
    "_name_or_path": "metadata",
    "bos_token_id": "tokenizer / generation setting, not model math",
    "eos_token_id": "tokenizer / generation setting, not model math",
    "pad_token_id": "tokenizer / generation setting (padding is given by masks here)",
    "use_cache": "inference switch of transformers",
    "initializer_range": "random-init scale; weights come from the checkpoint",
    "attention_dropout": "agentax applies no dropout (inference and RL fine-tuning run without it)",
    "pretraining_tp": "splits matmuls into slices in old Llama code; same result",
    "cache_implementation": "transformers cache class choice",
    "attn_implementation": "transformers kernel choice",
    "_attn_implementation_autoset": "transformers kernel choice",
    "id2label": "classification heads only",
    "label2id": "classification heads only",
    "problem_type": "classification heads only",
    "output_attentions": "transformers output switch",
    "output_hidden_states": "transformers output switch",
    "return_dict": "transformers output switch",
    "chunk_size_feed_forward": "chunking of the MLP; same result",
    "is_encoder_decoder": "always False for these decoder-only families",
    "tokenizer_class": "tokenizer setting",
    "_sliding_window_pattern": "Gemma 3: transformers' private copy of the pattern; it reads "
    "only `sliding_window_pattern` (default 6) or `layer_types`, and so does agentax",
}
"""config.json keys read by no math in agentax, with the reason each one is safe to skip."""

# transformers-5 defaults of each family's config class (a missing key means this value)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=None, head_dim=None, hidden_act="silu",
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, rope_theta=10000.0,
    ),
    "qwen2": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, head_dim=None, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        use_sliding_window=False, sliding_window=4096, max_window_layers=28, rope_theta=10000.0,
    ),
    "qwen3": dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, head_dim=128, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        attention_bias=False, use_sliding_window=False, sliding_window=4096,
        max_window_layers=28, rope_theta=10000.0,
    ),
    "gemma3": dict(
        vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072, rms_norm_eps=1e-6,
        tie_word_embeddings=True, attention_bias=False, query_pre_attn_scalar=256,
        sliding_window=4096, final_logit_softcapping=None, attn_logit_softcapping=None,
        use_bidirectional_attention=False, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        sliding_window_pattern=6,
    ),
}

_ACTIVATIONS = {
    "silu": "silu", "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
}
_ACTIVATIONS_TO_HF = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32", None: "float32"}
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
_ROPE_KEYS = {
    "default": {"rope_type", "type", "rope_theta"},
    "linear": {"rope_type", "type", "rope_theta", "factor"},
    "llama3": {
        "rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
        "original_max_position_embeddings",
    },
}


class _Fields:
    """A config dict that records which keys were read, with per-family defaults."""

    def __init__(self, raw: dict, defaults: dict, strict: bool):
        self.raw, self.defaults, self.strict, self.read = raw, defaults, strict, set()

    def __call__(self, key: str):
        self.read.add(key)
        if key in self.raw:
            return self.raw[key]
        return self.defaults.get(key)

    def has(self, key: str) -> bool:
        return key in self.raw and self.raw[key] is not None

    def reject(self, key: str, why: str) -> None:
        msg = f"config.json field '{key}'={self.raw.get(key)!r} is not supported: {why}"
        if self.strict:
            raise ValueError(msg)
        warnings.warn(msg + " (ignored because strict=False)", stacklevel=3)

    def check_leftovers(self) -> None:
        left = sorted(set(self.raw) - self.read - set(IGNORED_HF_FIELDS))
        if left:
            self.reject(
                left[0],
                f"agentax does not know whether unknown field(s) {left} change the model's math; "
                "remove them from config.json if they do not, or pass strict=False to skip them",
            )


def _family(config_json: dict) -> tuple[str, dict, dict]:
    """(family, text config dict, outer dict) of a config.json."""
    archs = config_json.get("architectures") or []
    if archs:
        arch = archs[0]
        if arch not in HF_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture '{arch}' in config.json; agentax loads "
                f"{sorted(HF_ARCHITECTURES)}"
            )
        family = HF_ARCHITECTURES[arch]
    else:
        model_type = config_json.get("model_type")
        if model_type not in _MODEL_TYPES and model_type != "gemma3":
            raise ValueError(
                f"config.json has no 'architectures' and model_type {model_type!r} is not one "
                f"of {sorted(_MODEL_TYPES)}; add \"architectures\": [...] naming one of "
                f"{sorted(HF_ARCHITECTURES)}"
            )
        arch = None
        family = _MODEL_TYPES.get(model_type, "gemma3")
    if arch == "Gemma3ForConditionalGeneration" or config_json.get("model_type") == "gemma3":
        if "text_config" not in config_json:
            raise ValueError("Gemma3ForConditionalGeneration config.json has no 'text_config'")
        text = dict(config_json["text_config"] or {})
        for key in ("tie_word_embeddings", "dtype", "torch_dtype"):  # set on the outer config
            if key not in text and key in config_json:
                text[key] = config_json[key]
        return family, text, config_json
    return family, config_json, config_json


def _rope(f: _Fields, params: dict | None, where: str, theta_default: float, max_pos: int):
    """(theta, RopeScaling | None) from one rope parameter dict."""
    params = dict(params or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_KEYS:
        f.reject(where, f"rope type '{kind}' is not implemented "
                 "(supported: default, linear, llama3)")
        kind = "default"
    extra = sorted(set(params) - _ROPE_KEYS[kind] - {"partial_rotary_factor"})
    if extra:
        f.reject(where, f"rope parameter(s) {extra} are not implemented for rope type '{kind}'")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        f.reject(where, "partial_rotary_factor != 1 (partial RoPE) is not implemented")
    theta = float(params.get("rope_theta") or theta_default)
    needed = {"linear": ["factor"], "llama3": ["factor", "low_freq_factor", "high_freq_factor"]}
    missing = [k for k in needed.get(kind, []) if params.get(k) is None]
    if missing:
        raise ValueError(f"config.json field '{where}' of rope type '{kind}' lacks {missing}")
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, RopeScaling(kind="linear", factor=float(params["factor"]))
    return theta, RopeScaling(
        kind="llama3",
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings") or max_pos
        ),
    )


def _rope_fields(f: _Fields, family: str, max_pos: int) -> dict:
    """rope_theta / rope_scaling (+ local ones for Gemma 3) from either config layout."""
    params = f("rope_parameters")
    old_scaling = f("rope_scaling")
    theta = f("rope_theta")
    if f("partial_rotary_factor") not in (None, 1.0):
        f.reject("partial_rotary_factor", "partial RoPE is not implemented")
    nested = isinstance(params, dict) and any(
        isinstance(v, dict) for v in params.values()
    )
    if family != "gemma3":
        if nested:
            f.reject("rope_parameters", f"per-layer-type RoPE is not defined for {family}")
            params = None
        merged = {**(old_scaling or {}), **(params or {})}
        where = "rope_parameters" if params else "rope_scaling"
        th, sc = _rope(f, merged, where, theta or 10000.0, max_pos)
        return dict(rope_theta=th, rope_scaling=sc)
    if params and not nested:
        f.reject("rope_parameters",
                 "Gemma 3 expects {'full_attention': ..., 'sliding_attention': ...}")
        params = None
    params = params or {}
    local_theta = f("rope_local_base_freq")
    full = {**(old_scaling or {}), **(params.get("full_attention") or {})}
    full_theta, full_sc = _rope(f, full, "rope_parameters.full_attention", theta, max_pos)
    local = params.get("sliding_attention") or {}
    local_theta_v, local_sc = _rope(
        f, local, "rope_parameters.sliding_attention", local_theta, max_pos
    )
    return dict(
        rope_theta=full_theta, rope_scaling=full_sc,
        rope_local_theta=local_theta_v, rope_local_scaling=local_sc,
    )


def _layer_types(f: _Fields, family: str, n: int) -> tuple[tuple | None, int | None]:
    """(layer_types or None when all full, sliding_window or None)."""
    if family == "llama":
        return None, None
    window = f("sliding_window")
    if family in ("qwen2", "qwen3"):
        max_window_layers = f("max_window_layers")
        if not f("use_sliding_window"):
            window = None  # transformers drops the window when use_sliding_window is false
    if family == "gemma3":  # old files: an int pattern (every pattern-th layer is full)
        # As transformers: only `sliding_window_pattern` (default 6) sets the layer types; the
        # `_sliding_window_pattern` it also writes is never read back (see IGNORED_HF_FIELDS).
        pattern = f("sliding_window_pattern")
    raw = f("layer_types")
    if raw is not None:
        if len(raw) != n:
            f.reject("layer_types", f"has {len(raw)} entries but num_hidden_layers={n}")
        bad = sorted(set(raw) - set(_LAYER_TYPES))
        if bad:
            f.reject("layer_types", f"layer type(s) {bad} are not implemented")
        types = tuple(_LAYER_TYPES.get(t, "full") for t in raw)
    elif family == "gemma3":
        types = tuple("sliding" if (i + 1) % pattern else "full" for i in range(n))
    else:
        types = tuple(
            "sliding" if window is not None and i >= max_window_layers else "full"
            for i in range(n)
        )
    if window is None or "sliding" not in types:
        return None, None  # a sliding layer without a window attends to everything
    return types, int(window)


def config_from_hf(config_json: dict, *, strict: bool = True) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face `config.json` dict.

    Args:
      config_json: the parsed config.json of a LlamaForCausalLM, Qwen2ForCausalLM,
        Qwen3ForCausalLM, Gemma3ForCausalLM (or Gemma3ForConditionalGeneration: its text model).
      strict: when True (default) an unknown field, or a value agentax cannot reproduce,
        raises ValueError naming the field; when False it only warns.

    Returns:
      The config; `dtype` and `param_dtype` follow the file's `dtype` / `torch_dtype`
      (float16 checkpoints compute in float32).
    """
    if not isinstance(config_json, dict):
        raise ValueError(f"config.json must hold a JSON object, got a {type(config_json).__name__}")
    family, raw, outer = _family(config_json)
    f = _Fields(raw, _DEFAULTS[family], strict)
    if family == "gemma3":
        act_key = "hidden_activation"
        f("hidden_act")  # older Gemma configs carry both; transformers uses hidden_activation
        if f("use_bidirectional_attention"):
            f.reject("use_bidirectional_attention", "agentax models are causal only")
    else:
        act_key = "hidden_act"
    if f("use_mrope"):
        f.reject("use_mrope", "multimodal RoPE is not implemented")
    if f.has("quantization_config"):
        f.reject("quantization_config", "quantised checkpoints are not supported; use bf16/fp32")
    act = f(act_key)
    if act not in _ACTIVATIONS:
        f.reject(act_key, f"activation '{act}' is not implemented "
                 f"(use one of {sorted(_ACTIVATIONS)})")
    dtype_name = f("dtype") if f.has("dtype") else f("torch_dtype")
    f("dtype"), f("torch_dtype")
    if dtype_name not in _DTYPES:
        f.reject("dtype", f"dtype '{dtype_name}' is not supported (float32, bfloat16, float16)")
    dtype = _DTYPES.get(dtype_name, "float32")

    heads = int(f("num_attention_heads"))
    hidden = int(f("hidden_size"))
    n = int(f("num_hidden_layers"))
    max_pos = int(f("max_position_embeddings"))
    kw: dict[str, Any] = dict(
        family=family,
        vocab_size=int(f("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(f("intermediate_size")),
        num_layers=n,
        num_heads=heads,
        num_kv_heads=int(f("num_key_value_heads") or heads),
        head_dim=int(f("head_dim") or hidden // heads),
        rms_norm_eps=float(f("rms_norm_eps")),
        hidden_act=_ACTIVATIONS.get(act, "silu"),
        tie_word_embeddings=bool(f("tie_word_embeddings")),
        max_position_embeddings=max_pos,
        dtype=dtype,
        param_dtype=dtype,
        **_rope_fields(f, family, max_pos),
    )
    layer_types, window = _layer_types(f, family, n)
    kw.update(layer_types=layer_types, sliding_window=window)
    if family == "llama":
        bias = bool(f("attention_bias"))
        kw.update(qk_norm=False, qkv_bias=bias, o_bias=bias, mlp_bias=bool(f("mlp_bias")))
    elif family == "qwen2":
        kw.update(qk_norm=False, qkv_bias=True, o_bias=False)
    elif family == "qwen3":
        bias = bool(f("attention_bias"))
        kw.update(qk_norm=True, qkv_bias=bias, o_bias=bias)
    else:
        bias = bool(f("attention_bias"))
        soft_final = f("final_logit_softcapping")
        if f("attn_logit_softcapping") is not None:
            # Published Gemma 3 files have null here, and transformers 5 stores the value but
            # never applies it, so a non-null value has no agreed meaning.
            f.reject("attn_logit_softcapping", "Gemma 3 has no attention soft-capping "
                     "(transformers ignores the field); set it to null")
        kw.update(
            norm_plus_one=True, qk_norm=True, post_norms=True, embed_scale=True,
            qkv_bias=bias, o_bias=bias,
            query_scale=float(f("query_pre_attn_scalar")) ** -0.5,
            final_logit_softcap=None if soft_final is None else float(soft_final),
        )
    if outer is not raw:  # Gemma3ForConditionalGeneration: the vision half is not used
        f.read.update(outer)
    f.check_leftovers()
    return ModelConfig(**kw)


def _rope_to_hf(theta: float, scaling: RopeScaling | None) -> dict:
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    if scaling.kind == "linear":
        return {"rope_type": "linear", "rope_theta": theta, "factor": scaling.factor}
    return {
        "rope_type": "llama3", "rope_theta": theta, "factor": scaling.factor,
        "low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor,
        "original_max_position_embeddings": scaling.original_max_position_embeddings,
    }


def config_to_hf(config: ModelConfig) -> dict:
    """The transformers-5 `config.json` dict of `config` (for `save_pretrained`).

    Raises ValueError naming the field when `config` uses a switch its family cannot express
    in Hugging Face terms (e.g. qk_norm=True with family='llama').
    """
    arch, model_type = _FAMILY_TO_HF[config.family]
    c = config
    layer_types = c.layer_types or ("full",) * c.num_layers
    hf: dict[str, Any] = dict(
        architectures=[arch], model_type=model_type, vocab_size=c.vocab_size,
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings, dtype=c.param_dtype,
    )
    if c.family == "gemma3":
        hf["hidden_activation"] = _ACTIVATIONS_TO_HF[c.hidden_act]
        scalar = c.q_scale**-2
        hf.update(
            attention_bias=c.qkv_bias,
            query_pre_attn_scalar=(
                int(round(scalar)) if abs(scalar - round(scalar)) < 1e-6 else scalar
            ),
            sliding_window=c.sliding_window,
            layer_types=[t + "_attention" for t in layer_types],
            attn_logit_softcapping=None,
            final_logit_softcapping=c.final_logit_softcap,
            use_bidirectional_attention=False,
            rope_parameters={
                "full_attention": _rope_to_hf(c.rope_theta, c.rope_scaling),
                "sliding_attention": _rope_to_hf(
                    c.rope_local_theta if c.rope_local_theta is not None else c.rope_theta,
                    c.rope_local_scaling if c.rope_local_theta is not None else c.rope_scaling,
                ),
            },
        )
    else:
        hf["hidden_act"] = _ACTIVATIONS_TO_HF[c.hidden_act]
        hf["rope_parameters"] = _rope_to_hf(c.rope_theta, c.rope_scaling)
    if c.family == "llama":
        hf.update(attention_bias=c.qkv_bias, mlp_bias=c.mlp_bias)
    if c.family in ("qwen2", "qwen3"):
        sliding = "sliding" in layer_types
        hf.update(
            use_sliding_window=sliding,
            sliding_window=c.sliding_window if sliding else None,
            max_window_layers=layer_types.index("sliding") if sliding else c.num_layers,
            layer_types=[t + "_attention" for t in layer_types],
        )
    if c.family == "qwen3":
        hf["attention_bias"] = c.qkv_bias
    _check_expressible(config, hf)
    return hf


def _canonical(config: ModelConfig) -> ModelConfig:
    """`config` with the switches that cannot change the math put in one standard form."""
    sliding = config.layer_types is not None and "sliding" in config.layer_types
    local_theta, local_scaling = None, None
    if sliding:
        local_theta, local_scaling = config.layer_rope(config.layer_types.index("sliding"))
    return dataclasses.replace(
        config,
        layer_types=config.layer_types if sliding else None,
        sliding_window=config.sliding_window if sliding else None,
        rope_local_theta=local_theta,
        rope_local_scaling=local_scaling,
        query_scale=round(config.q_scale, 12),
        dtype="float32",
        param_dtype="float32",
    )


def _check_expressible(config: ModelConfig, hf: dict) -> None:
    want, back = _canonical(config), _canonical(config_from_hf(hf))
    for field in dataclasses.fields(ModelConfig):
        a, b = getattr(want, field.name), getattr(back, field.name)
        if a != b:
            raise ValueError(
                f"ModelConfig.{field.name}={getattr(config, field.name)!r} cannot be written as a "
                f"Hugging Face {hf['architectures'][0]} config (it would load as {b!r}); change "
                "the field or the family"
            )
