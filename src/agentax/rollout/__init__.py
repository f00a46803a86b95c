"""agentax.rollout: the asyncio episode collector (groups and their filters live in agentax.pipeline)."""

from agentax.rollout._collector import Collector, CollectorConfig, GenerateFn, cut_short, episode_seed

__all__ = [
    "Collector",
    "CollectorConfig",
    "GenerateFn",
    "cut_short",
    "episode_seed",
]
