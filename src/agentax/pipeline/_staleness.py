"""Admission control that keeps every trained token within `max_staleness` policy versions.

Group number i (in admission order, counting only groups that will reach the trainer) is
destined for optimizer step floor(i / groups_per_step). Its tokens are sampled with weights of
version >= the version at admission, and trained when the trainer holds version
floor(i / groups_per_step). Admitting group i only once the trainer's version is at least
floor(i / groups_per_step) - max_staleness therefore bounds staleness by construction;
`max_staleness = 0` admits a step's groups only after the previous step's weights are
published — exactly the synchronous loop.

Groups that are filtered or fail never reach the trainer; `release` hands their place back so
the next admitted group takes it.
"""

from __future__ import annotations

import asyncio

__all__ = ["StalenessGate"]


class StalenessGate:
    """An asyncio gate: `await acquire()` before starting a group, `release()` if it is dropped.

    Args:
      max_staleness: how many versions behind the trainer a trained token may be (>= 0).
      groups_per_step: groups consumed by one optimizer step.
    """

    def __init__(self, max_staleness: int, groups_per_step: int):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if groups_per_step < 1:
            raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
        self.max_staleness = max_staleness
        self.groups_per_step = groups_per_step
        self._admitted = 0  # groups admitted that still count toward a step
        self._version = 0
        self._cond = asyncio.Condition()

    @property
    def version(self) -> int:
        return self._version

    @property
    def admitted(self) -> int:
        return self._admitted

    def _open(self) -> bool:
        target_step = self._admitted // self.groups_per_step
        return target_step - self._version <= self.max_staleness

    def would_block(self) -> bool:
        return not self._open()

    async def acquire(self) -> int:
        """Waits until one more group may start; returns the step it is destined for."""
        async with self._cond:
            await self._cond.wait_for(self._open)
            step = self._admitted // self.groups_per_step
            self._admitted += 1
            return step

    async def release(self) -> None:
        """A previously admitted group will not reach the trainer: give its place back."""
        async with self._cond:
            self._admitted -= 1
            self._cond.notify_all()

    async def set_version(self, version: int) -> None:
        """The trainer published `version`; groups for later steps may start."""
        async with self._cond:
            self._version = version
            self._cond.notify_all()
