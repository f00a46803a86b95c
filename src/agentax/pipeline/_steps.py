"""The pipeline's step records, its group filters and the small helpers of its loop."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np

from agentax.pipeline._accounting import Accounting
from agentax.records import Group, Trajectory, TrajectoryStatus

__all__ = ["PipelineResult", "StepRecord", "drop_all_equal_rewards", "group_staleness",
           "split_roles"]

_TRAINABLE = (TrajectoryStatus.OK, TrajectoryStatus.TRUNCATED)


def drop_all_equal_rewards(group: Group) -> str | None:
    """DAPO dynamic sampling: a group whose rewards are all equal has zero advantage."""
    rewards = group.rewards
    if len(rewards) > 1 and np.all(rewards == rewards[0]):
        return "all_equal_rewards"
    return None


_FILTERS = {"all_equal_rewards": drop_all_equal_rewards}


def split_roles(group: Group) -> list[Group]:
    """A multi-agent task's group as one GRPO group per (task, role): the trajectories of each
    role (`info["role"]`), with group id `<group_id>/<role>`; a single-agent group unchanged."""
    by_role: dict[str, list[Trajectory]] = {}
    for traj in group.trajectories:
        by_role.setdefault(str(traj.info.get("role", "")), []).append(traj)
    if list(by_role) == [""]:
        return [group]
    return [Group(group_id=f"{group.group_id}/{role}" if role else group.group_id,
                  task_id=group.task_id, trajectories=tuple(trajs))
            for role, trajs in by_role.items()]


def group_staleness(group: Group, version: int) -> int:
    """Versions between `version` and the oldest generated token of the group (0 if none)."""
    oldest = [int(t.versions[t.loss_mask > 0].min()) for t in group.trajectories if t.num_generated]
    return version - min(oldest) if oldest else 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRecord:
    """What happened at one optimizer step (host numbers, for metrics and tests)."""

    step: int
    policy_version: int
    group_ids: tuple[str, ...]
    reward_mean: float
    success_rate: float
    """Fraction of trained trajectories with reward > 0."""
    staleness: tuple[int, ...]
    """Per consumed group: trainer version minus the oldest token version."""
    trainer_wait_s: float
    train_s: float
    wall_s: float
    """Seconds since the run started, at the end of this step."""
    metrics: Any = None
    """The trainer's own metrics object for this step."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineResult:
    steps: tuple[StepRecord, ...]
    accounting: Accounting
    wall_s: float
    trainer_busy_s: float
    trainer_wait_s: float
    trajectories_trained: int

    @property
    def trainer_idle_fraction(self) -> float:
        return self.trainer_wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def trajectories_per_s(self) -> float:
        return self.trajectories_trained / self.wall_s if self.wall_s > 0 else 0.0


async def _result_or_failure(body: asyncio.Task, failure: asyncio.Future,
                             stop: asyncio.Future) -> None:
    """Waits for the run's body; raises the breaker's `RunFailed` if it stopped the run first
    (a body cancelled by an early stop, `stop`, ends normally)."""
    try:
        await body
    except asyncio.CancelledError:
        if failure.done():
            raise failure.exception() from None
        if not stop.done():
            raise


async def _next_group(ready: asyncio.Queue, producer: asyncio.Task,
                      timeout: float | None = None) -> tuple[int, Group] | None:
    """The next complete group, or None after `timeout` seconds; re-raises if the producer
    died instead of waiting forever."""
    get = asyncio.ensure_future(ready.get())
    try:
        done, _ = await asyncio.wait({get, producer}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        get.cancel()
        raise
    if get in done:
        return get.result()
    get.cancel()  # asyncio.Queue.get leaves the item in the queue when cancelled
    if not done:
        return None
    producer.result()  # raises the producer's exception
    raise RuntimeError("the producer stopped before the run finished")


@dataclasses.dataclass
class _Members:
    """A group's episodes so far: how many trajectories started (an episode counts one while
    it runs, one per trained role once it ends), those that finished, and finished episodes."""

    started: int = 0
    finished: list[Trajectory] = dataclasses.field(default_factory=list)
    episodes: int = 0


@dataclasses.dataclass(frozen=True)
class _Running:
    """A group being rolled out (async mode)."""

    index: int
    deadline: int
    started_at: float
    members: _Members
