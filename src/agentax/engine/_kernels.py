"""The engine's jitted kernels: a prefill chunk of several requests, and fused decode steps.

Both take `(model_def, weights, pool, table_sn, ...)` where `model_def` (a `ModelDef`:
graphdef and treedef, hashed once) is static and `weights` is the flat list of parameter
arrays (`jax.tree.leaves(state)`: a plain list keeps per-call dispatch in JAX's C++ fast
path). The KV cache is a pool of pages (per layer [P, K, PAGE, H]) and a page table
[S, pages per slot]. They donate the pool (updated in place) and never the weights (the
trainer may share them; an in-place publication writes new values into the engine's own
buffers with `weight_writer`). Attention is the ragged one of
`agentax.models.paged_forward` / `paged_decode_step`: each row reads its own pages, for as
many as it holds, so the kernels take no span and compile once per row and chunk bucket
(prefill) or once (decode), whatever max_seq_len is.

Depth: with a `LayerStack` in its `ModelDef`, an engine holds its weights stacked (one
[L, ...] array per per-layer parameter, packed once per installed or published version) and
its cache as a `StackedKV`; the kernels then run the layers as one `lax.scan`, so their HLO
and compile time do not grow with depth. Without one they run them as a Python loop.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentax.engine._config import PAGE
from agentax.engine._sampling import RowSampling, sample_tokens
from agentax.models import KVCache, LayerStack, StackedKV
from agentax.models import PAGE as MODEL_PAGE
from agentax.models import paged_decode_step, paged_forward, scatter_pages

assert PAGE == MODEL_PAGE, "the engine's page size is the model code's"

__all__ = ["ModelDef", "prefill_chunk", "decode_steps", "copy_pages", "compiled_count",
           "weight_writer", "weight_packer"]


class ModelDef:
    """A model's (graphdef, treedef) as a jit static argument, hashed once, and its
    `LayerStack` when the engine holds the layers stacked (the kernels' `weights` are then
    `stack.pack(leaves)`, not the flat leaves).

    jit hashes its static arguments on every call; flax's `GraphDef.__hash__` walks every node
    (measured 1.4 ms against 0.5 ms per call of the tiny model with the hash cached).
    """

    __slots__ = ("graphdef", "treedef", "stack", "_hash")

    def __init__(self, graphdef, treedef, stack: LayerStack | None = None):
        self.graphdef, self.treedef, self.stack = graphdef, treedef, stack
        self._hash = hash((graphdef, treedef, stack))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (
            isinstance(other, ModelDef) and self._hash == other._hash
            and self.graphdef == other.graphdef and self.treedef == other.treedef
            and self.stack == other.stack
        )

    def pack(self, leaves: list, dtypes: list | None = None) -> list:
        """The kernels' weights from the model's flat leaves (traceable), each cast to
        `dtypes` (per kernel weight) when given."""
        if self.stack is not None:
            return self.stack.pack(leaves, dtypes)
        return list(leaves) if dtypes is None else [x.astype(d) for x, d in zip(leaves, dtypes)]

    def unpack(self, weights: list) -> list:
        """The model's flat leaves from the kernels' weights (traceable)."""
        return list(weights) if self.stack is None else self.stack.unpack(weights)

    def model(self, weights: list):
        """The full `Transformer` (its layers unrolled) over the kernels' weights (traceable:
        stacked weights are sliced), for passes other than the engine's kernels."""
        return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, self.unpack(weights)))


def _decode_loop(model_def, weights, step_fn, fresh, state_4s, sampling, stop_ids_sm,
                 num_steps, t_max):
    """The fused decode steps; `step_fn(model, tokens, positions, fresh, i)` runs one step
    over a cache it only reads and returns (logits, fresh). Returns (tokens, logprobs,
    counts, fresh K/V of the call's steps)."""
    tokens_s, positions_s, remaining_s = state_4s[0], state_4s[1], state_4s[3]
    active_s = state_4s[2] != 0
    model = _merge(model_def, weights)
    s = tokens_s.shape[0]
    out_tok = jnp.zeros((s, num_steps), jnp.int32)
    out_lp = jnp.zeros((s, num_steps), jnp.float32)
    counts = jnp.zeros((s,), jnp.int32)

    def cond(carry):
        i, active = carry[0], carry[4]
        return (i < num_steps) & jnp.any(active)

    def body(carry):
        i, fresh, tok, pos, active, remaining, out_tok, out_lp, counts = carry
        logits, fresh = step_fn(model, tok, pos, fresh, i)
        new_tok, lp = sample_tokens(logits, sampling, pos + 1)
        new_tok = jnp.where(active, new_tok, tok)
        out_tok = out_tok.at[:, i].set(new_tok)
        out_lp = out_lp.at[:, i].set(lp)
        step = active.astype(jnp.int32)
        counts, remaining, pos = counts + step, remaining - step, pos + step
        hit_stop = jnp.any(new_tok[:, None] == stop_ids_sm, axis=-1)
        done = hit_stop | (remaining <= 0) | (pos >= t_max - 1)
        active = active & ~done
        return (i + 1, fresh, new_tok, pos, active, remaining, out_tok, out_lp, counts)

    carry = (0, fresh, tokens_s, positions_s, active_s, remaining_s, out_tok, out_lp, counts)
    # Even one step runs in the loop: unrolled, XLA could schedule a layer's write before its
    # own read of the cache and copied the whole cache to keep both (35 against 3 ms per call,
    # measured on the former row layout).
    carry = jax.lax.while_loop(cond, body, carry)
    _, fresh, _, _, _, _, out_tok, out_lp, counts = carry
    return out_tok, out_lp, counts, fresh


@functools.partial(jax.jit, static_argnums=(0, 8), donate_argnums=(2,))
def prefill_chunk(model_def, weights, pool: KVCache, table_sn, tokens_rc, positions_rc,
                  slots_r, sampling: RowSampling, t_max: int):
    """Feeds one chunk of R requests' tokens (one row each) and samples after each last token.

    Attention reads each row's pages in blocks for as long as the call's longest row needs
    (`paged_forward`): one compilation per (row bucket, chunk bucket).

    Args:
      pool: the page pools (donated); table_sn: [S, pages per slot] each slot's pages.
      tokens_rc: [R, C] token ids, right-aligned: each row's last token sits in the last
        column (padding before it), so the last layer runs for that column alone.
      positions_rc: [R, C] absolute positions; padding carries t_max (writes nothing), so a
        padding row (all t_max) changes no page.
      slots_r: [R] the slot of each row (distinct among real rows).
      sampling: R rows of sampling parameters.
      t_max: max_seq_len.

    Returns:
      (tokens [R] int32, logprobs [R] float32, new pool). A row's sample is only meaningful
      when the chunk is the last of its prompt.
    """
    model = _merge(model_def, weights)
    logits_rv, pool = paged_forward(model, tokens_rc, positions_rc, pool, table_sn[slots_r],
                                    t_max, last_only=True)
    token, logprob = sample_tokens(logits_rv, sampling, positions_rc[:, -1] + 1)
    return token, logprob, pool


@functools.partial(jax.jit, static_argnums=(0, 7, 8), donate_argnums=(2,))
def decode_steps(model_def, weights, pool: KVCache, table_sn, state_4s,
                 sampling: RowSampling, stop_ids_sm, num_steps: int, t_max: int):
    """Runs up to `num_steps` decode steps over every slot, stopping slots on device.

    Each step feeds slot s its pending token at its position and samples the next one. A
    slot stops (and writes nothing from then on) after sampling a stop id, after its
    `remaining` budget runs out, or when the next token would not fit in the slot. The loop
    exits early when no slot is active. Each step's attention reads only the active slots'
    own pages (`paged_decode_step`: its cost follows the sum of their lengths, not slots x
    the longest). The loop only reads the pool: each step's K/V go to a small
    [S, K, num_steps, H] buffer per layer, scattered to their pages once after the loop.

    Args:
      pool: the page pools (donated); table_sn: [S, pages per slot] each slot's pages.
      state_4s: [4, S] int32, the rows being: pending token of each slot, position of that
        token, active flag (1 = decodes; idle and prefilling slots write nothing), tokens
        each slot may still generate. Packed so a step costs one host transfer.
      sampling: per-slot sampling parameters.
      stop_ids_sm: [S, M] int32 ids that end a slot's completion (-1 = unused).
      num_steps: static number of steps to fuse.
      t_max: max_seq_len.

    Returns:
      (tokens [S, N] int32, logprobs [S, N] float32, counts [S] int32 tokens emitted per
      slot (a prefix of each row), new pool).
    """
    start_s, active_s = state_4s[1], state_4s[2] != 0
    slots = state_4s.shape[1]
    if isinstance(pool, StackedKV):
        fresh = pool.fresh(num_steps, slots)
    else:
        fresh = KVCache(*(tuple(jnp.zeros((slots, p.shape[1], num_steps, p.shape[3]), p.dtype)
                                for p in part) for part in (pool.k, pool.v)))

    def step(model, tok, pos, fresh, i):
        return paged_decode_step(model, tok, pos, pool, table_sn, fresh, i, start_s, active_s)

    out_tok, out_lp, counts, fresh = _decode_loop(
        model_def, weights, step, fresh, state_4s, sampling, stop_ids_sm, num_steps, t_max)
    j = jnp.arange(num_steps)[None, :]
    positions = jnp.where(j < counts[:, None], start_s[:, None] + j, t_max)  # [S, F]

    def write(p, f):  # f [S, K, F, H]
        return scatter_pages(p, table_sn, positions, f.transpose(0, 2, 1, 3), t_max)

    if isinstance(pool, StackedKV):  # every layer in one scatter
        write = jax.vmap(write)
        return out_tok, out_lp, counts, StackedKV(write(pool.k, fresh.k), write(pool.v, fresh.v))
    pool = KVCache(tuple(map(write, pool.k, fresh.k)), tuple(map(write, pool.v, fresh.v)))
    return out_tok, out_lp, counts, pool


@functools.partial(jax.jit, donate_argnums=(0,))
def copy_pages(pool: KVCache, src_n: jax.Array, dst_n: jax.Array) -> KVCache:
    """Copies pages `src_n` onto `dst_n` in every layer (copy on write of shared pages);
    padding entries carry a destination past the pool (written nowhere)."""
    def copy(p):
        return p.at[dst_n].set(p[jnp.minimum(src_n, p.shape[0] - 1)], mode="drop")

    if isinstance(pool, StackedKV):
        return StackedKV(jax.vmap(copy)(pool.k), jax.vmap(copy)(pool.v))
    return KVCache(tuple(map(copy, pool.k)), tuple(map(copy, pool.v)))


def weight_writer(model_def: ModelDef, shardings: list) -> Any:
    """A jitted `write(old, new)`: the model's flat leaves `new`, cast to `old`'s dtypes and
    packed into the kernels' layout (`model_def.pack`: stacked layers are cast before they
    are stacked), written into `old`'s buffers (donated: the result aliases them, so a
    publication holds no second copy of the engine's weights), laid out on `shardings` (the
    engine's own, so no kernel recompiles for another spelling of the same layout). Compiled
    once per source dtypes, never per version."""
    def write(old: list, new: list) -> list:
        if model_def.stack is None:
            return model_def.pack(new, [o.dtype for o in old])
        # Stacked: each layer's leaf written into the donated stack at its index. A packed
        # stack (jnp.stack of the cast leaves) was computed aside and copied in: 1.68 x the
        # engine's weights of temporaries at Qwen3-0.6B shapes, against none this way.
        stack = model_def.stack
        n = len(stack.rest_index)
        out = [new[k].astype(o.dtype) for k, o in zip(stack.rest_index, old)]
        for ix, o in zip(stack.layer_index, old[n:]):
            for layer, k in enumerate(ix):
                o = jax.lax.dynamic_update_index_in_dim(o, new[k].astype(o.dtype), layer, 0)
            out.append(o)
        return out

    return jax.jit(write, donate_argnums=(0,), keep_unused=True,  # kept: donated
                   out_shardings=list(shardings))


def weight_packer(model_def: ModelDef, shardings: list) -> Any:
    """A jitted `pack(leaves)`: the kernels' weights (stacked layers) as new buffers on
    `shardings`, from the model's flat leaves already in the engine's dtypes."""
    return jax.jit(model_def.pack, out_shardings=list(shardings))


def _merge(model_def: ModelDef, weights):
    if model_def.stack is not None:
        return model_def.stack.merge(weights)
    return nnx.merge(model_def.graphdef, jax.tree.unflatten(model_def.treedef, weights))


def compiled_count() -> int:
    """Compilations held by the engine kernels' caches (shared by every engine in the process)."""
    return int(sum(k._cache_size() for k in (prefill_chunk, decode_steps, copy_pages)))
