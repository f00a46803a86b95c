"""`PipelineConfig`: how rollout and training are wired together."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["PipelineConfig", "GROUP_FILTERS"]

GROUP_FILTERS = ("all_equal_rewards",)
"""Names accepted in `PipelineConfig.filters` (failed groups are always dropped and counted)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """Knobs of the producer/consumer pipeline."""

    mode: Literal["sync", "async"] = "async"
    """'sync': collect a full batch, train, publish (the classic loop). 'async': rollout and
    training overlap; groups stream to the trainer as they complete."""
    max_staleness: int = 1
    """How many policy versions behind the trainer a trained token may be. 0 reproduces sync."""
    group_size: int = 4
    """Samples per task (G); advantages are computed within a group."""
    groups_per_step: int = 4
    """Groups consumed by one optimizer step."""
    max_concurrency: int = 32
    """Episodes in flight at once (each needs an engine slot while it decodes)."""
    publish_every: int = 1
    """Publish weights to the engine after every k optimizer steps."""
    queue_size: int = 0
    """Complete groups that may wait for the trainer before producers block; 0 means
    groups_per_step * (max_staleness + 1)."""
    filters: tuple[str, ...] = ("all_equal_rewards",)
    """Group filters applied before training (see GROUP_FILTERS)."""
    seed: int = 0
    """Run seed; each episode's sampling seed derives from (seed, group index, sample index)."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(
                f"pipeline.max_staleness must be >= 0 (0 = synchronous), got {self.max_staleness}"
            )
        if self.group_size < 1 or self.groups_per_step < 1:
            raise ValueError("pipeline.group_size and pipeline.groups_per_step must be >= 1")
        if self.max_concurrency < 1:
            raise ValueError(f"pipeline.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.publish_every < 1:
            raise ValueError(f"pipeline.publish_every must be >= 1, got {self.publish_every}")
        if self.publish_every > 1 and self.max_staleness < self.publish_every - 1:
            raise ValueError(
                f"publish_every={self.publish_every} makes tokens up to {self.publish_every - 1} "
                f"versions stale, above max_staleness={self.max_staleness}; raise max_staleness "
                "or publish every step"
            )
        unknown = sorted(set(self.filters) - set(GROUP_FILTERS))
        if unknown:
            raise ValueError(f"unknown pipeline.filters {unknown}; choose from {list(GROUP_FILTERS)}")

    @property
    def effective_queue_size(self) -> int:
        return self.queue_size or self.groups_per_step * (self.max_staleness + 1)
