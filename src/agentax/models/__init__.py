"""agentax.models: one NNX transformer for Llama 3, Qwen2/2.5, Qwen3 and Gemma 3 text models."""

from agentax.models._checkpoint import load_pretrained, read_hf_config, save_pretrained
from agentax.models._config import BYTE_VOCAB_SIZE, ModelConfig, RopeScaling
from agentax.models._hf_config import (
    HF_ARCHITECTURES,
    IGNORED_HF_FIELDS,
    config_from_hf,
    config_to_hf,
)
from agentax.models._params import ParamSpec, hf_param_table
from agentax.models._transformer import (
    KVCache,
    Transformer,
    init_cache,
    kv_cache_bytes,
    positions_from_segments,
)

__all__ = [
    "BYTE_VOCAB_SIZE",
    "HF_ARCHITECTURES",
    "IGNORED_HF_FIELDS",
    "KVCache",
    "ModelConfig",
    "ParamSpec",
    "RopeScaling",
    "Transformer",
    "config_from_hf",
    "config_to_hf",
    "hf_param_table",
    "init_cache",
    "kv_cache_bytes",
    "load_pretrained",
    "positions_from_segments",
    "read_hf_config",
    "save_pretrained",
]
