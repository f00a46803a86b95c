"""`PipelineConfig`: how rollout and training are wired together."""

from __future__ import annotations

import dataclasses
from typing import Literal

from agentax.pipeline._staleness import STRAGGLER_FACTOR

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
    filters: tuple[str, ...] = ("all_equal_rewards",)
    """Group filters applied before training (see GROUP_FILTERS)."""
    straggler_factor: float = STRAGGLER_FACTOR
    """Async mode: a running group that blocks a step while complete groups could fill it is
    dropped (counted as stale) once it has run this many times the median recent group time.
    Dropped episodes are samples the trainer never sees (a bias toward fast episodes where
    slowness correlates with behaviour); 0 never drops: the trainer waits for every admitted
    group (docs/async.md, "Dropping stragglers")."""
    seed: int = 0
    """Run seed; each episode's sampling seed derives from (seed, group index, sample index)."""
    breaker_window: int = 64
    """The failure breaker watches this many of the latest finished episodes (0 disables it;
    a dead engine still stops the run)."""
    breaker_failure_rate: float = 1.0
    """The run stops when at least this fraction of the watched episodes failed for the same
    reason (1.0: every one of them)."""
    stall_timeout_s: float = 900.0
    """The run stops when no group reached the trainer for this long (keep it above
    collector.episode_timeout_s)."""
    max_dropped_episodes: int = 4096
    """The run stops when this many episodes in a row were dropped by the group filters with
    no step in between (an untrained policy whose groups all get equal rewards samples
    forever otherwise); 0 never stops. Failed episodes are the breaker's (breaker_window)."""
    rest_confident_after: int = 3
    """A task whose groups came back all-equal (dropped by the 'all_equal_rewards' filter) this
    many times in a row rests: its next admission is skipped, and twice as many after each
    further all-equal group (up to rest_confident_max), so other tasks get the rollouts; a group
    of it whose rewards differ ends the rest. Skipped admissions start no episode and are
    counted by task (accounting 'rested'). 0 never rests a task."""
    rest_confident_max: int = 32
    """The most admissions of one resting task skipped in a row."""
    stop_success: float = 0.0
    """RL ends before its last step once the latest `stop_window` finished training episodes
    succeeded (reward > 0) at this rate or more, e.g. 0.95: the policy has converged on its
    training tasks and later groups would mostly come back all-equal and be dropped. The
    episodes of every finished group count (a dropped group's too; a failed episode is a
    failure); the step in flight finishes, groups still running are cancelled. 0 never stops
    early. One process only (each process would decide on its own episodes)."""
    stop_window: int = 256
    """Finished training episodes `stop_success` is measured over."""
    loop_block_limit_s: float = 10.0
    """The run stops when the event loop was blocked this long (e.g. `time.sleep` inside an
    async environment step); 0 disables the watchdog."""
    env_threads: int = 32
    """Threads for synchronous environment calls (a pool of their own, daemon threads); a
    stepping episode holds one, so keep it >= max_concurrency for sync environments."""
    tool_threads: int = 32
    """Threads for synchronous tool calls (a pool of their own, daemon threads)."""
    reward_threads: int = 16
    """Threads for synchronous reward functions (a pool of their own, daemon threads)."""

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise ValueError(f"pipeline.mode must be 'sync' or 'async', got {self.mode!r}")
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
        if self.breaker_window < 0:
            raise ValueError(f"pipeline.breaker_window must be >= 0 (0 disables), got {self.breaker_window}")
        if not 0.0 < self.breaker_failure_rate <= 1.0:
            raise ValueError(
                f"pipeline.breaker_failure_rate must be in (0, 1], got {self.breaker_failure_rate}"
            )
        if self.max_dropped_episodes < 0:
            raise ValueError(f"pipeline.max_dropped_episodes must be >= 0 (0 never stops), got "
                             f"{self.max_dropped_episodes}")
        if self.rest_confident_after < 0:
            raise ValueError(f"pipeline.rest_confident_after must be >= 0 (0 never rests a task), "
                             f"got {self.rest_confident_after}")
        if self.rest_confident_max < 1:
            raise ValueError(f"pipeline.rest_confident_max must be >= 1, got "
                             f"{self.rest_confident_max}")
        if not 0.0 <= self.stop_success <= 1.0:
            raise ValueError(f"pipeline.stop_success must be in [0, 1] (0 never stops early), "
                             f"got {self.stop_success}")
        if self.stop_window < 1:
            raise ValueError(f"pipeline.stop_window must be >= 1 episodes, got {self.stop_window}")
        if not self.stall_timeout_s > 0 or self.stall_timeout_s == float("inf"):
            raise ValueError(f"pipeline.stall_timeout_s must be a positive number of seconds, "
                             f"got {self.stall_timeout_s}")
        if not self.loop_block_limit_s >= 0 or self.loop_block_limit_s == float("inf"):
            raise ValueError(f"pipeline.loop_block_limit_s must be >= 0 seconds (0 disables), "
                             f"got {self.loop_block_limit_s}")
        if not (self.straggler_factor == 0 or 1.0 < self.straggler_factor < float("inf")):
            raise ValueError(f"pipeline.straggler_factor must be > 1 (a multiple of the median "
                             f"group time) or 0 (never drop), got {self.straggler_factor}")
        for name in ("env_threads", "tool_threads", "reward_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"pipeline.{name} must be >= 1, got {getattr(self, name)}")
        unknown = sorted(set(self.filters) - set(GROUP_FILTERS))
        if unknown:
            raise ValueError(f"unknown pipeline.filters {unknown}; choose from {list(GROUP_FILTERS)}")
