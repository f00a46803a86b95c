"""agentax.rollout: the asyncio episode collector (groups and their filters live in agentax.pipeline).

One episode loop for single-agent environments and multi-agent ones (`RolePolicy` says which
model plays each role; `FunctionPolicy` is a fixed programmatic player, `SnapshotPolicy` a
frozen snapshot of the trained policy)."""

from agentax.rollout._collector import Collector, CollectorConfig, GenerateFn, RolePolicy, cut_short, episode_seed
from agentax.rollout._policies import FunctionPolicy
from agentax.rollout._snapshot import SnapshotPolicy

__all__ = [
    "Collector",
    "CollectorConfig",
    "FunctionPolicy",
    "GenerateFn",
    "RolePolicy",
    "SnapshotPolicy",
    "cut_short",
    "episode_seed",
]
