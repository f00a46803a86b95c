"""agentax.rollout: the asyncio episode collector (groups and their filters live in agentax.pipeline).

One episode loop for single-agent environments and multi-agent ones (`RolePolicy` says which
model plays each role; `FunctionPolicy` is a fixed programmatic player)."""

from agentax.rollout._collector import Collector, CollectorConfig, GenerateFn, RolePolicy, cut_short, episode_seed
from agentax.rollout._policies import FunctionPolicy

__all__ = [
    "Collector",
    "CollectorConfig",
    "FunctionPolicy",
    "GenerateFn",
    "RolePolicy",
    "cut_short",
    "episode_seed",
]
