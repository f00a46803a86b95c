"""Shared pieces of the checkpoint/parity tests: tiny random `transformers` models and jitted
agentax forward / greedy kernels."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

VOCAB = 128

# Tiny random configs, each exercising switches that change the math.
HF_CASES: dict[str, tuple[type, dict]] = {
    # tied embeddings, non-default rope_theta, qkv bias, Qwen sliding window on layers >= 1
    "qwen2": (transformers.Qwen2Config, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6,
        use_sliding_window=True, sliding_window=8, max_window_layers=1,
    )),
    # untied embeddings, one kv head, head_dim 24 != hidden/heads, attention bias (q/k/v/o)
    "qwen3": (transformers.Qwen3Config, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=24, tie_word_embeddings=False, attention_bias=True,
    )),
    # llama3 rope scaling that matters at these lengths, head_dim 40, attention + mlp bias
    "llama": (transformers.LlamaConfig, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=40, attention_bias=True, mlp_bias=True,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": 5e5, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
        },
    )),
    # sliding/full layer mix with a window shorter than the sequence, local rope base, linear
    # scaling on global layers, query_pre_attn_scalar != head_dim, final soft-capping, 1 kv head
    "gemma3": (transformers.Gemma3TextConfig, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, sliding_window=8, query_pre_attn_scalar=48,
        final_logit_softcapping=15.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e3},
        },
    )),
}


def make_hf_model(name: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A float32 random `transformers` causal LM of case `name`, with every weight random.

    Norm weights are randomised too (default init is all ones / zeros), so a loader that mixes
    up two norms fails the parity tests; a larger init scale makes greedy argmax ties unlikely.
    """
    cls, kwargs = HF_CASES[name]
    config = cls(vocab_size=VOCAB, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    gemma = name.startswith("gemma")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.generation_config.eos_token_id = None  # generate exactly max_new_tokens
    model.generation_config.pad_token_id = 0
    return model.eval()


def hf_logits(model, ids: np.ndarray, **kwargs) -> np.ndarray:
    with torch.no_grad():
        kwargs = {k: torch.as_tensor(v) for k, v in kwargs.items()}
        return model(torch.as_tensor(ids), **kwargs).logits.float().numpy()


def hf_greedy(model, prompt: np.ndarray, steps: int) -> np.ndarray:
    with torch.no_grad():
        out = model.generate(
            torch.as_tensor(prompt), attention_mask=torch.ones_like(torch.as_tensor(prompt)),
            max_new_tokens=steps, do_sample=False,
        )
    return out[:, prompt.shape[1]:].numpy()


@jax.jit
def forward_kernel(graphdef, state, ids_bt, positions_bt, segment_ids_bt, mask_bt):
    model = nnx.merge(graphdef, state)
    return model(ids_bt, positions_bt, segment_ids_bt, mask_bt)


def ax_logits(model, ids, positions=None, segment_ids=None, mask=None) -> np.ndarray:
    """Jitted full-sequence logits; unused inputs become neutral arrays so one compile serves
    plain, padded and packed calls of the same shape."""
    b, t = ids.shape
    if positions is None:
        positions = np.broadcast_to(np.arange(t), (b, t))
    segment_ids = np.ones((b, t), np.int32) if segment_ids is None else segment_ids
    mask = np.ones((b, t), np.int32) if mask is None else mask
    graphdef, state = nnx.split(model)
    out = forward_kernel(
        graphdef, state, jnp.asarray(ids, jnp.int32), jnp.asarray(positions, jnp.int32),
        jnp.asarray(segment_ids, jnp.int32), jnp.asarray(mask, jnp.int32),
    )
    return np.asarray(out)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def greedy_kernel(graphdef, state, prompt_bt, steps, max_seq_len):
    """Prefill over pages (`paged_forward`), then `steps` greedy decode steps in one
    lax.scan, each a one-token `paged_forward`."""
    from agentax.models import PAGE, init_page_pool, paged_forward

    model = nnx.merge(graphdef, state)
    b, t = prompt_bt.shape
    per_row = -(-max_seq_len // PAGE)
    cache = init_page_pool(model.config, b * per_row)
    table = jnp.arange(b * per_row, dtype=jnp.int32).reshape(b, per_row)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits, cache = paged_forward(model, prompt_bt, positions, cache, table, max_seq_len,
                                  last_only=True)  # [B, V]
    first = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def step(carry, _):
        token_b, pos, cache = carry
        logits, cache = paged_forward(model, token_b[:, None], jnp.full((b, 1), pos, jnp.int32),
                                      cache, table, max_seq_len, last_only=False)  # [B, 1, V]
        nxt = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        return (nxt, pos + 1, cache), token_b

    _, tokens = jax.lax.scan(step, (first, jnp.int32(t), cache), None, length=steps)
    return tokens.T  # [B, steps]


def ax_greedy(model, prompt: np.ndarray, steps: int) -> np.ndarray:
    graphdef, state = nnx.split(model)
    out = greedy_kernel(graphdef, state, jnp.asarray(prompt, jnp.int32), steps,
                        prompt.shape[1] + steps)
    return np.asarray(out)
