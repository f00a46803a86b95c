"""agentax.models: one NNX transformer for Llama 3, Qwen2/2.5, Qwen3 and Gemma 3 text models."""

from agentax.models._config import BYTE_VOCAB_SIZE, ModelConfig, RopeScaling
from agentax.models._transformer import (
    KVCache,
    Transformer,
    init_cache,
    kv_cache_bytes,
    positions_from_segments,
)

__all__ = [
    "BYTE_VOCAB_SIZE",
    "KVCache",
    "ModelConfig",
    "RopeScaling",
    "Transformer",
    "init_cache",
    "kv_cache_bytes",
    "positions_from_segments",
]
