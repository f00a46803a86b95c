"""Batch placement on the trainer's mesh; the mesh and the parameter rules live in
`agentax.models` (the engine shards by the same rules) and are re-exported here.

Batches are sharded over ('data', 'fsdp') on rows.
"""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentax.models import (DEFAULT_PARTITION_RULES, MESH_AXES, make_mesh, param_sharding_fn,
                            param_shardings, partition_spec_for, shard_params)

__all__ = ["DEFAULT_PARTITION_RULES", "MESH_AXES", "make_mesh", "partition_spec_for",
           "shard_params", "batch_sharding", "data_parallel_size", "param_shardings",
           "param_sharding_fn"]


def data_parallel_size(mesh: Mesh | None) -> int:
    """Number of batch shards (data * fsdp); batch rows must be a multiple of it."""
    if mesh is None:
        return 1
    return int(mesh.shape["data"] * mesh.shape["fsdp"])


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows over ('data', 'fsdp'), time replicated."""
    return NamedSharding(mesh, P(("data", "fsdp"), None))
