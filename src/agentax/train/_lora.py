"""LoRA fine-tuning with Flax's `nnx.LoRALinear`, applied to projections chosen by name.

`apply_lora` swaps matching `nnx.Linear` modules for `nnx.LoRALinear` (same kernel and bias,
plus `lora.lora_a` [in, r] and zero-initialised `lora.lora_b` [r, out], both `nnx.LoRAParam`),
so the adapted model starts out computing exactly what the base model computes. Only
`LoRAParam`s are trained. `merge_lora` folds the adapters into the kernels
(W' = W + A @ B) and returns the parameter state of a plain `Transformer`, which is what the
engine and the Hugging Face exporter consume.

Departure from Hu et al. 2021: no alpha / r scaling factor (nnx.LoRA has none), i.e. alpha = r.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
from flax import nnx

from agentax.train._config import LoRAConfig

__all__ = ["apply_lora", "merge_lora", "lora_paths"]


def _path_str(path) -> str:
    return "/".join(str(p) for p in path)


def lora_paths(model: nnx.Module, config: LoRAConfig) -> list[tuple]:
    """Module paths of the `nnx.Linear` layers that `config.targets` selects."""
    pats = [re.compile(t) for t in config.targets]
    out = []
    for path, mod in nnx.iter_modules(model):
        if type(mod) is nnx.Linear and any(p.search(_path_str(path)) for p in pats):
            out.append(path)
    return out


def _parent(model, path):
    node = model
    for p in path[:-1]:
        node = node[p] if isinstance(p, int) else getattr(node, p)
    return node


def apply_lora(model: nnx.Module, config: LoRAConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    """Replaces the selected linear layers of `model` in place by LoRA layers; returns it.

    Raises:
      ValueError: when no layer matches `config.targets`.
    """
    paths = lora_paths(model, config)
    if not paths:
        names = sorted({_path_str(p).split("/")[-1] for p, m in nnx.iter_modules(model)
                        if type(m) is nnx.Linear})
        raise ValueError(f"LoRA targets {config.targets} match no linear layer; linear layer "
                         f"names are {names}")
    for path in paths:
        parent = _parent(model, path)
        old = parent[path[-1]] if isinstance(path[-1], int) else getattr(parent, path[-1])
        new = nnx.LoRALinear(
            old.in_features, old.out_features, lora_rank=config.rank,
            use_bias=old.bias is not None, dtype=old.dtype, param_dtype=old.param_dtype,
            lora_dtype=old.dtype, lora_param_dtype=jnp.float32, rngs=rngs)
        new.kernel[...] = old.kernel[...]
        if old.bias is not None:
            new.bias[...] = old.bias[...]
        setattr(parent, path[-1], new)
    return model


def merge_lora(state: nnx.State, dtype=None) -> nnx.State:
    """Full parameter state with each adapter folded in: kernel += lora_a @ lora_b.

    The sum is formed in float32 and rounded once, to `dtype`: a bfloat16 base plus a delta
    below half its ulp keeps the delta when the caller asks for float32, instead of losing it
    to a bfloat16 round trip.

    Args:
      state: the parameter state of a LoRA-adapted model (`nnx.state(model, nnx.Param)`).
      dtype: dtype of every floating leaf of the result; None = each kernel's own dtype
        (leaves without an adapter are then passed through, not copied).
    Returns:
      An `nnx.State` with the tree of the plain model (no `lora` entries).
    """
    flat = dict(nnx.to_flat_state(state))
    merged = {}
    for path, var in flat.items():
        if "lora" in path:
            continue
        w = var[...]
        out_dtype = w.dtype if dtype is None or not jnp.issubdtype(w.dtype, jnp.floating) \
            else jnp.dtype(dtype)
        lora_a = flat.get(path[:-1] + ("lora", "lora_a"))
        if path[-1] == "kernel" and lora_a is not None:
            lora_b = flat[path[:-1] + ("lora", "lora_b")]
            delta = jnp.asarray(lora_a[...], jnp.float32) @ jnp.asarray(lora_b[...], jnp.float32)
            var = var.replace(value=(w.astype(jnp.float32) + delta).astype(out_dtype))
        elif w.dtype != out_dtype:
            var = var.replace(value=w.astype(out_dtype))
        merged[path] = var
    return nnx.from_flat_state(list(merged.items()))
