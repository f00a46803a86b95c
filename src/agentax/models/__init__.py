"""agentax.models: one NNX transformer for Llama 3, Qwen2/2.5, Qwen3 and Gemma 3 text models."""

from agentax.models._checkpoint import load_pretrained, read_hf_config, save_pretrained
from agentax.models._config import BYTE_VOCAB_SIZE, ModelConfig, RopeScaling
from agentax.models._hf_config import config_from_hf, config_to_hf
from agentax.models._paged import (PAGE, KVCache, init_page_pool, page_pool_bytes,
                                   paged_decode_step, paged_forward, scatter_pages)
from agentax.models._sharding import (DEFAULT_PARTITION_RULES, MESH_AXES, make_mesh,
                                      param_sharding_fn, param_shardings, partition_spec_for,
                                      shard_params)
from agentax.models._stacked import LayerStack, StackedKV, plan_layer_stack
from agentax.models._transformer import SCAN_AUTO_MIN_LAYERS, Transformer

__all__ = [
    "BYTE_VOCAB_SIZE",
    "DEFAULT_PARTITION_RULES",
    "MESH_AXES",
    "PAGE",
    "SCAN_AUTO_MIN_LAYERS",
    "KVCache",
    "LayerStack",
    "ModelConfig",
    "RopeScaling",
    "Transformer",
    "config_from_hf",
    "config_to_hf",
    "init_page_pool",
    "load_pretrained",
    "make_mesh",
    "page_pool_bytes",
    "paged_decode_step",
    "paged_forward",
    "param_sharding_fn",
    "param_shardings",
    "partition_spec_for",
    "read_hf_config",
    "save_pretrained",
    "scatter_pages",
    "shard_params",
    "StackedKV",
    "plan_layer_stack",
]
