"""A transformer whose decoder layers are held stacked along a leading layer axis, so that the
engine's cached forwards over pages (prefill, fused decode) run them as one `lax.scan` and
compile one layer whatever the depth.

The trainer's scanned forward (`_scan.run_layers`) stacks the weights inside its kernel, once
per step; a decode kernel called every few tokens cannot copy every weight per call, so here
the weights are stacked once, outside the kernels, when an engine installs or publishes them
(`LayerStack.pack`), and each scan iteration slices its layer. The KV cache is stacked the
same way (`StackedKV`: k and v [L, P, K, PAGE, H]); a layer reads and writes it at its layer
index inside the scan, in place.

`LayerStack` is the static description (hashed once, a jit static argument through the
engine's `ModelDef`): which flat parameter leaves (`jax.tree.leaves(nnx.state(model))`) are
the embedding, final norm and head (kept as they are) and which are layer l's copy of each
per-layer parameter. Layers whose RoPE frequencies or sliding windows differ (Gemma 3) pass
them as scanned data, as `_scan.run_layers` does; the paged attention takes a traced window.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from agentax.models._layers import rope_inv_freq

__all__ = ["LayerStack", "StackedKV", "StackedTransformer", "plan_layer_stack"]


class StackedKV(NamedTuple):
    """A page pool with every layer in one array: `k`, `v` [L, P, K, PAGE, H]; layer l's is
    `k[l]`, the layout of one `KVCache` layer."""

    k: jax.Array
    v: jax.Array

    def fresh(self, steps: int, slots: int) -> StackedKV:
        """Zeroed [L, S, K, steps, H] buffers for the K/V of one fused decode call."""
        l, _, kv, _, h = self.k.shape
        shape = (l, slots, kv, steps, h)
        return StackedKV(jnp.zeros(shape, self.k.dtype), jnp.zeros(shape, self.v.dtype))


class LayerStack:
    """Where one model's flat parameter leaves go in the stacked layout: the leaves outside
    the layers first (in their order), then one [L, ...] array per per-layer parameter.

    Built by `plan_layer_stack`; hashable (a jit static argument)."""

    def __init__(self, *, shell_graphdef, shell_treedef, block_graphdef, block_treedef,
                 rest_index, layer_index, inv_freq, windows):
        self.shell_graphdef, self.shell_treedef = shell_graphdef, shell_treedef
        self.block_graphdef, self.block_treedef = block_graphdef, block_treedef
        self.rest_index = tuple(rest_index)
        """Full-leaf index of each leaf outside the layers."""
        self.layer_index = tuple(tuple(ix) for ix in layer_index)
        """[j][l]: full-leaf index of layer l's copy of per-layer parameter j."""
        self.inv_freq = inv_freq
        """[L, H/2] RoPE frequencies per layer when they differ (else None: the block's)."""
        self.windows = windows
        """Sliding window per layer (0: none) when they differ (else None: the block's)."""
        self._key = (shell_graphdef, shell_treedef, block_graphdef, block_treedef,
                     self.rest_index, self.layer_index,
                     None if inv_freq is None else inv_freq.tobytes(), windows)
        self._hash = hash(self._key)

    @property
    def num_layers(self) -> int:
        return len(self.layer_index[0])

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, LayerStack) and self._hash == other._hash
                                 and self._key == other._key)

    def pack(self, leaves: list, dtypes: list | None = None) -> list:
        """The stacked layout of a model's flat leaves (traceable; `dtypes`, per stacked-layout
        leaf, casts each leaf before it is stacked, so a float32 source is never stacked)."""
        cast = (lambda x, i: x) if dtypes is None else (lambda x, i: x.astype(dtypes[i]))
        n = len(self.rest_index)
        out = [cast(leaves[k], i) for i, k in enumerate(self.rest_index)]
        out += [jnp.stack([cast(leaves[k], n + j) for k in ix])
                for j, ix in enumerate(self.layer_index)]
        return out

    def unpack(self, weights: list) -> list:
        """The model's flat leaves from the stacked layout (traceable: layer l's are slices)."""
        n = len(self.rest_index)
        full = [None] * (n + sum(len(ix) for ix in self.layer_index))
        for k, w in zip(self.rest_index, weights[:n]):
            full[k] = w
        for ix, w in zip(self.layer_index, weights[n:]):
            for layer, k in enumerate(ix):
                full[k] = w[layer]
        return full

    def shardings(self, leaf_shardings: list) -> list:
        """The stacked layout's shardings from the model's per-leaf ones: a stacked leaf takes
        layer 0's sharding with a leading unsharded layer axis."""
        def lead(s):
            if isinstance(s, NamedSharding):
                return NamedSharding(s.mesh, P(None, *s.spec))
            return s  # one device: the same placement
        return ([leaf_shardings[k] for k in self.rest_index]
                + [lead(leaf_shardings[ix[0]]) for ix in self.layer_index])

    def merge(self, weights: list) -> StackedTransformer:
        return StackedTransformer(self, weights)


def plan_layer_stack(model: nnx.Module) -> LayerStack | str:
    """The `LayerStack` of a `Transformer` (arrays or abstract), or why its layers cannot be
    scanned (a string): parameters of different structure across layers (LoRA on some layers
    only). Layers that differ in window or RoPE (Gemma 3) pass them as scanned data."""
    graphdef, state = nnx.split(model)
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    index = {p: i for i, p in enumerate(paths)}
    blocks = [nnx.split(b) for b in model.layers]
    if len(blocks) < 2:
        return "fewer than two layers"
    structure = {(jax.tree.structure(st), tuple((v.shape, v.dtype) for v in jax.tree.leaves(st)))
                 for _, st in blocks}
    if len(structure) != 1:
        return "the layers' parameters differ in structure (e.g. adapters on some layers only)"
    cfg = model.config
    windows = tuple(cfg.layer_window(i) or 0 for i in range(len(blocks)))
    ropes = [cfg.layer_rope(i) for i in range(len(blocks))]
    uniform = len(set(windows)) == 1 and len(set(ropes)) == 1
    if uniform and len({gd for gd, _ in blocks}) != 1:
        return "the layers' static attributes differ"
    shell = nnx.merge(graphdef, state)
    shell.layers = nnx.List([])
    shell_graphdef, shell_state = nnx.split(shell)
    shell_leaves, shell_treedef = jax.tree_util.tree_flatten_with_path(shell_state)
    block_graphdef, block_state = blocks[0]
    block_paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(block_state)[0]]
    layers_key = next(p[0] for p in paths if _key(p[0]) == "layers")
    layer_keys = sorted({p[1] for p in paths if p[0] == layers_key}, key=_key)
    return LayerStack(
        shell_graphdef=shell_graphdef, shell_treedef=shell_treedef,
        block_graphdef=block_graphdef, block_treedef=jax.tree.structure(block_state),
        rest_index=[index[p] for p, _ in shell_leaves],
        layer_index=[[index[(layers_key, lk, *bp)] for lk in layer_keys] for bp in block_paths],
        inv_freq=None if uniform else np.stack(
            [rope_inv_freq(cfg.head_dim, *r) for r in ropes]).astype(np.float32),
        windows=None if uniform else windows,
    )


def _key(k):
    return getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))


class StackedTransformer:
    """The engine kernels' view of a `Transformer` in the stacked layout (built inside a
    kernel by `LayerStack.merge`): the embedding, final norm and head as a `Transformer`
    without layers, and `scan` to run a per-layer body over the stacked layers (what
    `paged_forward` and `paged_decode_step` do with it)."""

    def __init__(self, stack: LayerStack, weights: list):
        n = len(stack.rest_index)
        self.stack = stack
        self.shell = nnx.merge(stack.shell_graphdef,
                               jax.tree.unflatten(stack.shell_treedef, weights[:n]))
        self.config = self.shell.config
        self.layer_leaves = list(weights[n:])

    def embed_tokens(self, ids):
        return self.shell.embed_tokens(ids)

    def final_norm(self, x):
        return self.shell.final_norm(x)

    def logits(self, x):
        return self.shell.logits(x)

    def scan(self, body, x, carry):
        """Runs `x, carry = body(block, layer, inv_freq, window, x, carry)` for every layer as
        one `lax.scan`: `block` is layer `layer`'s `Block` (its weights sliced from the
        stack), `inv_freq` / `window` its RoPE frequencies and window (0: none) when layers
        differ in them, else None (the block's own, static)."""
        s = self.stack
        inv = None if s.inv_freq is None else jnp.asarray(s.inv_freq)
        win = None if s.windows is None else jnp.asarray(s.windows, jnp.int32)
        xs = (self.layer_leaves, jnp.arange(s.num_layers, dtype=jnp.int32), inv, win)

        def step(c, layer):
            leaves, i, inv_i, win_i = layer
            block = nnx.merge(s.block_graphdef, jax.tree.unflatten(s.block_treedef, leaves))
            return body(block, i, inv_i, win_i, *c), None

        (x, carry), _ = jax.lax.scan(step, (x, carry), xs)
        return x, carry
