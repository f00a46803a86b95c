"""agentax.rollout: the asyncio episode collector and the group queue that streams to training."""

from agentax.rollout._collector import Collector, CollectorConfig, GenerateFn, episode_seed
from agentax.rollout._group_queue import GroupFilter, GroupQueue, drop_all_equal_rewards, drop_failed

__all__ = [
    "Collector",
    "CollectorConfig",
    "GenerateFn",
    "GroupFilter",
    "GroupQueue",
    "drop_all_equal_rewards",
    "drop_failed",
    "episode_seed",
]
