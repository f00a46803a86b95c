"""`GroupQueue`: buckets finished trajectories by group and releases complete groups at once.

GRPO-style estimators need all G samples of a task before any advantage exists, so the queue
holds trajectories per group and hands the group on the moment its last member arrives —
no batch barrier across groups. Group filters run here (drop groups whose rewards are all
equal, drop groups with failed members, ...); a dropped group is counted under its reason.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence

import numpy as np

from agentax.records import Group, Trajectory, TrajectoryStatus

__all__ = ["GroupQueue", "GroupFilter", "drop_all_equal_rewards", "drop_failed"]

GroupFilter = Callable[[Group], str | None]
"""A filter returns None to keep a group, or the reason it is dropped."""


def drop_all_equal_rewards(group: Group) -> str | None:
    """DAPO dynamic sampling: a group whose rewards are all equal has zero advantage."""
    rewards = group.rewards
    if len(rewards) > 1 and np.all(rewards == rewards[0]):
        return "all_equal_rewards"
    return None


def drop_failed(group: Group) -> str | None:
    """Drops a group if any member ended in an error status (not ok / truncated)."""
    trainable = (TrajectoryStatus.OK, TrajectoryStatus.TRUNCATED)
    for traj in group.trajectories:
        if traj.status not in trainable:
            return f"member_{traj.status.value}"
    return None


class GroupQueue:
    """Collects trajectories into groups of `group_size` and queues complete, kept groups.

    Args:
      group_size: G, the number of samples per task.
      filters: functions run on each complete group; the first that names a reason drops it.
      maxsize: bound on complete groups waiting for the consumer (0 = unbounded); `put`
        waits when it is reached, which is the back-pressure of the pipeline.
      on_drop: called with (group, reason) for every group a filter drops.
    """

    def __init__(
        self,
        group_size: int,
        filters: Sequence[GroupFilter] = (),
        maxsize: int = 0,
        on_drop: Callable[[Group, str], None] | None = None,
    ):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self.filters = tuple(filters)
        self.on_drop = on_drop
        self._partial: dict[str, list[Trajectory]] = {}
        self._ready: asyncio.Queue[Group] = asyncio.Queue(maxsize)
        self.dropped: collections.Counter[str] = collections.Counter()
        """Dropped groups by reason."""
        self.dropped_trajectories: collections.Counter[str] = collections.Counter()
        self.released = 0

    @property
    def pending_groups(self) -> int:
        """Groups with some but not all members finished."""
        return len(self._partial)

    def qsize(self) -> int:
        return self._ready.qsize()

    async def put(self, traj: Trajectory) -> Group | None:
        """Adds a finished trajectory; returns the group if this completed and kept it."""
        members = self._partial.setdefault(traj.group_id, [])
        members.append(traj)
        if len(members) < self.group_size:
            return None
        del self._partial[traj.group_id]
        members.sort(key=lambda t: t.sample_index)
        group = Group(group_id=traj.group_id, task_id=traj.task_id, trajectories=tuple(members))
        for keep in self.filters:
            reason = keep(group)
            if reason is not None:
                self.dropped[reason] += 1
                self.dropped_trajectories[reason] += len(members)
                if self.on_drop is not None:
                    self.on_drop(group, reason)
                return None
        await self._ready.put(group)
        self.released += 1
        return group

    async def get(self) -> Group:
        return await self._ready.get()

    def get_nowait(self) -> Group:
        return self._ready.get_nowait()

    def drain(self) -> tuple[list[Group], list[Trajectory]]:
        """Removes everything still held: complete groups and members of partial groups."""
        groups = []
        while not self._ready.empty():
            groups.append(self._ready.get_nowait())
        partial = [t for members in self._partial.values() for t in members]
        self._partial.clear()
        return groups, partial
