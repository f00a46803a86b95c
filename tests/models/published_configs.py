"""config.json files of the published checkpoints behind the presets (as on the Hugging Face Hub).

Kept here so tests can check presets and `config_from_hf` without downloading anything.
"""

QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}

LLAMA3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3",
    },
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}

GEMMA3_270M = {
    "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None,
    "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "initializer_range": 0.02,
    "intermediate_size": 2048,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
    "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0",
    "use_bidirectional_attention": False, "use_cache": True, "vocab_size": 262144,
}

GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144,
}

PUBLISHED = {
    "qwen2.5-0.5b": (QWEN2_5_0_5B, 494_032_768),
    "qwen3-0.6b": (QWEN3_0_6B, 596_049_920),
    "llama3.2-1b": (LLAMA3_2_1B, 1_235_814_400),
    "gemma3-270m": (GEMMA3_270M, 268_098_176),
    "gemma3-1b": (GEMMA3_1B, 999_885_952),
}
"""preset name -> (config.json, published parameter count)."""
