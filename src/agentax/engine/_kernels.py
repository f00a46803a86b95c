"""The engine's jitted kernels: one prefill chunk, and a fused run of decode steps over all slots.

Both take `(model_def, weights, cache, ...)` where `model_def = (graphdef, treedef)` is static
and `weights` is the flat list of parameter arrays (`jax.tree.leaves(state)`: a plain list
keeps per-call dispatch in JAX's C++ fast path). They donate the cache (updated in place) and
never the weights (the trainer may share them). Shapes are fixed per engine: prefill compiles
once per chunk bucket, decode once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from agentax.engine._sampling import RowSampling, sample_tokens
from agentax.models import KVCache

__all__ = ["prefill_chunk", "decode_steps", "compiled_count"]


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def prefill_chunk(
    model_def,
    weights,
    cache: KVCache,
    tokens_1c: jax.Array,
    positions_1c: jax.Array,
    slot_1: jax.Array,
    last_index_1: jax.Array,
    sampling: RowSampling,
):
    """Feeds one chunk of one slot's tokens and samples the token after its last real one.

    Args:
      tokens_1c: [1, C] token ids (padding anywhere after the real ones).
      positions_1c: [1, C] absolute positions; padding rows carry max_seq_len (write nothing).
      slot_1: [1] the cache slot.
      last_index_1: [1] index of the last real token in the chunk.
      sampling: one row of sampling parameters.

    Returns:
      (token [1] int32, logprob [1] float32, new cache). The sample is only meaningful for
      the last chunk of a prompt.
    """
    model = _merge(model_def, weights)
    logits_1v, cache = model.forward_cached(
        tokens_1c, positions_1c, cache, slot_ids_b=slot_1, logits_index_b=last_index_1
    )
    sample_pos = jnp.take_along_axis(positions_1c, last_index_1[:, None], axis=1)[:, 0] + 1
    token, logprob = sample_tokens(logits_1v, sampling, sample_pos)
    return token, logprob, cache


@functools.partial(jax.jit, static_argnums=(0, 9), donate_argnums=(2,))
def decode_steps(
    model_def,
    weights,
    cache: KVCache,
    tokens_s: jax.Array,
    positions_s: jax.Array,
    active_s: jax.Array,
    remaining_s: jax.Array,
    sampling: RowSampling,
    stop_ids_sm: jax.Array,
    num_steps: int,
):
    """Runs up to `num_steps` decode steps over every slot, stopping slots on device.

    Each step feeds slot s its pending token at its position and samples the next one. A
    slot stops (and writes nothing from then on) after sampling a stop id, after its
    `remaining` budget runs out, or when the next token would not fit in the slot. The loop
    exits early when no slot is active.

    Args:
      tokens_s: [S] int32 pending token of each slot.
      positions_s: [S] int32 position of the pending token.
      active_s: [S] bool slots that decode (idle / parked / prefilling slots write nothing).
      remaining_s: [S] int32 tokens each slot may still generate.
      sampling: per-slot sampling parameters.
      stop_ids_sm: [S, M] int32 ids that end a slot's completion (-1 = unused).
      num_steps: static number of steps to fuse.

    Returns:
      (tokens [S, N] int32, logprobs [S, N] float32, counts [S] int32 tokens emitted per
      slot (a prefix of each row), new cache).
    """
    model = _merge(model_def, weights)
    s = tokens_s.shape[0]
    t_max = cache.max_seq_len
    out_tok = jnp.zeros((s, num_steps), jnp.int32)
    out_lp = jnp.zeros((s, num_steps), jnp.float32)
    counts = jnp.zeros((s,), jnp.int32)

    def cond(carry):
        i, active = carry[0], carry[4]
        return (i < num_steps) & jnp.any(active)

    def body(carry):
        i, cache, tok, pos, active, remaining, out_tok, out_lp, counts = carry
        write_pos = jnp.where(active, pos, t_max)
        logits, cache = model.forward_cached(tok[:, None], write_pos[:, None], cache)
        new_tok, lp = sample_tokens(logits[:, 0], sampling, pos + 1)
        new_tok = jnp.where(active, new_tok, tok)
        out_tok = out_tok.at[:, i].set(new_tok)
        out_lp = out_lp.at[:, i].set(lp)
        step = active.astype(jnp.int32)
        counts, remaining, pos = counts + step, remaining - step, pos + step
        hit_stop = jnp.any(new_tok[:, None] == stop_ids_sm, axis=-1)
        done = hit_stop | (remaining <= 0) | (pos >= t_max - 1)
        active = active & ~done
        return (i + 1, cache, new_tok, pos, active, remaining, out_tok, out_lp, counts)

    carry = (0, cache, tokens_s, positions_s, active_s, remaining_s, out_tok, out_lp, counts)
    # One step needs no loop: a while_loop carrying the cache costs copies on CPU (measured
    # in benchmarks/engine.py: 1 step per call was several times faster than 4 or 8).
    carry = body(carry) if num_steps == 1 else jax.lax.while_loop(cond, body, carry)
    _, cache, _, _, _, _, out_tok, out_lp, counts = carry
    return out_tok, out_lp, counts, cache


def _merge(model_def, weights):
    graphdef, treedef = model_def
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, weights))


def compiled_count() -> int:
    """Compilations held by the engine kernels' caches (shared by every engine in the process)."""
    return int(prefill_chunk._cache_size() + decode_steps._cache_size())
