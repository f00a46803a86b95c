"""The decoder layers of the full-sequence forward (training, scoring), under remat.

With `scan`, the layers run as one `lax.scan` over their weights stacked inside the kernel (in
the compute dtype), so the compiled step holds one layer whatever the depth; each layer's RoPE
frequencies and sliding window are scanned data (Gemma 3 alternates them). Layers whose
parameters differ in structure (LoRA on some layers only) run as a loop instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from agentax.models._config import ModelConfig
from agentax.models._layers import rope_inv_freq

__all__ = ["run_layers"]

_REMAT_POLICIES = {
    "full": None,  # save nothing but each layer's input
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _compute_cast(path, x, dtype):
    """A layer weight as the forward uses it: Linear kernels and biases in the compute dtype
    (nnx.Linear casts them at use anyway; casting before stacking halves the stacked copy of
    float32 master weights), norms and adapters as they are."""
    name = str(getattr(path[-1], "key", path[-1]))
    if name in ("kernel", "bias") and jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(dtype)
    return x


def run_layers(blocks, cfg: ModelConfig, x, positions_bt, seg_bt, *, remat: str, scan: bool,
               impl: str, block: int, pin=lambda x: x):
    """The decoder `blocks` of the full-sequence forward over x [B, T, D], scanned or looped,
    under remat; `pin` constrains the activations' sharding at each layer."""
    if remat not in ("none", *_REMAT_POLICIES):
        raise ValueError(f"remat must be 'none', 'full' or 'save_dots', got {remat!r}")

    def checkpointed(fn):
        if remat == "none":
            return fn
        return jax.checkpoint(fn, policy=_REMAT_POLICIES[remat], prevent_cse=not scan)

    splits = [nnx.split(b) for b in blocks]
    structure = {(jax.tree.structure(st), tuple((v.shape, v.dtype) for v in jax.tree.leaves(st)))
                 for _, st in splits}
    if not scan or len(blocks) < 2 or len(structure) != 1:
        for gd, st in splits:
            def one(x, st, gd=gd):
                return pin(nnx.merge(gd, st)(pin(x), positions_bt, seg_bt, impl=impl,
                                             block=block))
            x = checkpointed(one)(x, st)
        return x
    dtype = jnp.dtype(cfg.dtype)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs),
                           *[jax.tree_util.tree_map_with_path(
                               lambda p, v: _compute_cast(p, v, dtype), st) for _, st in splits])
    inv_freq = jnp.stack([jnp.asarray(rope_inv_freq(cfg.head_dim, *cfg.layer_rope(i)))
                          for i in range(len(blocks))])  # [L, H/2]
    windows = [cfg.layer_window(i) or 0 for i in range(len(blocks))]
    graphdef = splits[0][0]
    # One window for all layers stays static (Qwen, Llama: none); Gemma's differ per layer.
    static_window = windows[0] if len(set(windows)) == 1 else None

    def body(x, layer):
        st, inv, window = layer
        window = static_window if static_window is not None else window
        y = nnx.merge(graphdef, st)(pin(x), positions_bt, seg_bt, inv_freq=inv, window=window,
                                    impl=impl, block=block)
        return pin(y), None

    xs = (stacked, inv_freq, jnp.asarray(windows, jnp.int32))
    x, _ = jax.lax.scan(checkpointed(body), x, xs)
    return x
