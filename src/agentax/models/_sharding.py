"""Device mesh (data / fsdp / tensor) and regex partition rules for the model's parameter tree.

Shared by the trainer (every axis) and the engine (the tensor axis: tensor parallelism).

Parameter paths are joined with '/' (e.g. 'layers/3/attn/q_proj/kernel'); the first rule whose
regex matches (re.search) gives the PartitionSpec. A mesh axis that does not divide its
dimension is dropped for that parameter (it is replicated along that axis instead), so the
same rules serve every model size.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

__all__ = ["DEFAULT_PARTITION_RULES", "MESH_AXES", "make_mesh", "partition_spec_for",
           "shard_params", "param_shardings", "param_sharding_fn"]

MESH_AXES = ("data", "fsdp", "tensor")

# Kernels are [in, out]. Column-parallel (q/k/v/gate/up): out over tensor; row-parallel
# (o/down): in over tensor; the other dimension is fully sharded over fsdp.
DEFAULT_PARTITION_RULES: tuple[tuple[str, P], ...] = (
    (r"embed/embedding$", P("tensor", "fsdp")),  # [V, D]
    (r"lm_head/kernel$", P("fsdp", "tensor")),  # [D, V]
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/kernel$", P("fsdp", "tensor")),
    (r"(o_proj|down_proj)/kernel$", P("tensor", "fsdp")),
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/bias$", P("tensor")),
    (r"lora_a$", P("fsdp", None)),  # [in, r]
    (r"lora_b$", P(None, "tensor")),  # [r, out]
    (r".*", P()),  # norms, other biases, value head: replicated
)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh with axes ('data', 'fsdp', 'tensor') over the first data*fsdp*tensor devices."""
    devices = list(jax.devices() if devices is None else devices)
    n = data * fsdp * tensor
    if min(data, fsdp, tensor) < 1:
        raise ValueError(f"mesh axis sizes must be >= 1, got data={data} fsdp={fsdp} "
                         f"tensor={tensor}")
    if n > len(devices):
        raise ValueError(f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {n} devices, "
                         f"only {len(devices)} available (on CPU set XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={n} before importing jax)")
    return Mesh(np.asarray(devices[:n]).reshape(data, fsdp, tensor), MESH_AXES)


def _path_str(path) -> str:
    """'layers/0/attn/q_proj/kernel' from a pytree key path (nnx's trailing '.value' dropped)."""
    parts = []
    for k in path:
        k = getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
        parts.append(str(k))
    if parts and parts[-1] == "value" and isinstance(path[-1], jax.tree_util.GetAttrKey):
        parts.pop()
    return "/".join(parts)


def partition_spec_for(path: str, shape: tuple[int, ...], mesh: Mesh,
                       rules: Sequence[tuple[str, P]] = DEFAULT_PARTITION_RULES) -> P:
    """The PartitionSpec of one parameter (first matching rule, non-dividing axes dropped)."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            break
    else:
        return P()
    if len(spec) > len(shape):
        return P()
    out = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axis,) if isinstance(axis, str) else tuple(axis or ())
        size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
        out.append(axis if names and dim % size == 0 else None)
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def param_shardings(tree, mesh: Mesh, rules: Sequence[tuple[str, P]] = DEFAULT_PARTITION_RULES):
    """A tree of NamedShardings matching `tree` (arrays or ShapeDtypeStructs)."""
    def one(path, x):
        return NamedSharding(mesh, partition_spec_for(_path_str(path), tuple(x.shape), mesh, rules))
    return jax.tree_util.tree_map_with_path(one, tree)


def param_sharding_fn(mesh: Mesh, rules: Sequence[tuple[str, P]] = DEFAULT_PARTITION_RULES):
    """`fn(path, shape) -> NamedSharding`: where `rules` put one parameter on `mesh`.

    `agentax.models.load_pretrained(path, shardings=fn)` then loads straight into the mesh.
    """
    def fn(path: str, shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(mesh, partition_spec_for(path, tuple(shape), mesh, rules))
    return fn


def shard_params(tree, mesh: Mesh, rules: Sequence[tuple[str, P]] = DEFAULT_PARTITION_RULES):
    """Places every leaf of `tree` on `mesh` according to `rules`."""
    return jax.device_put(tree, param_shardings(tree, mesh, rules))
