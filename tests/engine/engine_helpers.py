"""Helpers shared by the engine tests (imported as a top-level module by pytest's rootdir mode)."""

from __future__ import annotations

import asyncio
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentax.engine import EngineConfig

# Every test engine uses this shape so the kernels compile once per test session.
CFG = EngineConfig(max_slots=4, max_seq_len=96, prefill_chunk=32)  # 8 decode steps per call




def run(coro):
    return asyncio.run(coro)


@functools.partial(jax.jit, static_argnums=0)
def _last_logits(graphdef, state, ids_1t, last):
    model = nnx.merge(graphdef, state)
    return model(ids_1t)[0, last]


def reference_greedy(model, prompt, n: int, pad_to: int = 128) -> list[int]:
    """agentax's own full-sequence greedy decoding: argmax of model(ids) at the last position.

    Right padding to a fixed length keeps one compilation; causal attention makes it inert.
    """
    graphdef, state = nnx.split(model)
    ids = list(int(i) for i in prompt)
    for _ in range(n):
        buf = np.zeros((1, pad_to), np.int32)
        buf[0, : len(ids)] = ids
        logits = _last_logits(graphdef, state, jnp.asarray(buf), len(ids) - 1)
        ids.append(int(jnp.argmax(logits)))
    return ids[len(prompt):]


def random_prompts(rng: np.random.Generator, n: int, lo: int, hi: int, vocab: int = 256):
    return [rng.integers(0, vocab, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def make_hf_model(family: str, seed: int = 0):
    """A tiny float32 random `transformers` causal LM (large init: argmax ties are rare)."""
    import torch
    import transformers

    common = dict(
        vocab_size=272, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )
    cls, extra = {
        # qkv bias, tied embeddings, a sliding window on layer 1 shorter than the prompts
        "qwen2": (transformers.Qwen2Config, dict(
            tie_word_embeddings=True, use_sliding_window=True, sliding_window=8,
            max_window_layers=1)),
        "qwen3": (transformers.Qwen3Config, dict(head_dim=24, tie_word_embeddings=False)),
        "llama": (transformers.LlamaConfig, dict(rms_norm_eps=1e-5, tie_word_embeddings=False)),
    }[family]
    torch.manual_seed(seed)
    config = cls(**common, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens
    model.generation_config.pad_token_id = 0
    return model.eval()
