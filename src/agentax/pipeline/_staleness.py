"""Admission and batch choice that keep every trained token within `max_staleness` versions.

A group admitted while the engine holds published version `p` samples every token with
weights of version >= p, so it may be trained at any trainer version <= p + max_staleness: its
**deadline**. The gate keeps the groups admitted but not yet trained (or dropped) *schedulable*:
the trainer, now at version t, takes `groups_per_step` groups per step, so for every version d

    #(outstanding groups with deadline <= d)  <=  (d - t + 1) * groups_per_step.       (*)

* Admission (`acquire`) adds a group with deadline p + max_staleness, the latest possible one,
  so it only needs room at that deadline: `outstanding < (p + max_staleness - t + 1) * gps`.
* The trainer (`fits`) builds each batch from complete groups, earliest deadline first, and
  takes a group only if the groups that (*) forces into *this* step still fit into the batch;
  otherwise it waits for them. After the step (*) holds again for version t + 1.

So no admitted group can miss its deadline: the trainer waits for a straggler when (and only
when) its deadline has come. The bound is never relaxed; a group that is staler than
`max_staleness` anyway (it can only happen if weights are published out of band) is still
dropped and counted by the pipeline.

Waiting has a price with a long-tailed rollout time: every group of the steps behind the
straggler waits with it. `StragglerLimit` says when waiting is no longer worth it — the group
has run `STRAGGLER_FACTOR` (3.5) times as long as the median recent group, and enough complete groups
are ready to fill the step without it — and the pipeline then drops it (counted as `stale`,
its place released, a fresh group admitted). Dropping a group never breaks the bound: the
batch rule above is unchanged and only ever sees fewer groups.

`max_staleness = 0` admits a step's groups only once the previous step's weights are
published, and the trainer must take exactly those: the synchronous loop. Groups that are
filtered or fail never reach the trainer; `release` hands their place back.

Versions here count from the start of the run (the pipeline subtracts its start version).
"""

from __future__ import annotations

import asyncio
import collections
import statistics
from collections.abc import Iterable

__all__ = ["STRAGGLER_FACTOR", "StalenessGate", "StragglerLimit"]

STRAGGLER_FACTOR = 3.5
"""A group that blocks the trainer is dropped once it has run this many times as long as the
median recent group. Chosen by simulation (docs/async.md, "Dropping stragglers"): with
lognormal environment steps (p99 = 10 x median) it drops 0.9% of groups and raises the
throughput the bound allows by 3.1% at max_staleness=2 (1.6% at 1); 3 drops 1.6% for 5.4%,
but a short run's drop fraction spreads around its mean, and 3.5 keeps it under 2% in 93% of
24-step runs (3: 82%). The median, unlike a high quantile, is not pulled down by the groups
the rule itself drops (they are never observed to finish), so the drop rate cannot feed on
itself."""


class StalenessGate:
    """Admission control and deadline bookkeeping for bounded-staleness training.

    Args:
      max_staleness: how many versions behind the trainer a trained token may be (>= 0).
      groups_per_step: groups consumed by one optimizer step (>= 1).
    """

    def __init__(self, max_staleness: int, groups_per_step: int):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if groups_per_step < 1:
            raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
        self.max_staleness = max_staleness
        self.groups_per_step = groups_per_step
        self.trained = 0
        """The trainer's version (optimizer steps taken)."""
        self.published = 0
        """The version the engine samples new groups with."""
        self._deadlines: collections.Counter[int] = collections.Counter()  # outstanding groups
        self._cond = asyncio.Condition()

    # ------------------------------------------------------------------ state

    @property
    def outstanding(self) -> int:
        """Groups admitted and not yet trained or released."""
        return sum(self._deadlines.values())

    def capacity(self) -> int:
        """How many groups may be outstanding at once now."""
        return (self.published + self.max_staleness - self.trained + 1) * self.groups_per_step

    def would_block(self) -> bool:
        return self.outstanding >= self.capacity()

    def _forced(self, d: int) -> int:
        """Groups with deadline <= d that must be in the batch of the current step."""
        due = sum(n for deadline, n in self._deadlines.items() if deadline <= d)
        return due - (d - self.trained) * self.groups_per_step

    # ------------------------------------------------------------------ producer side

    async def acquire(self) -> int:
        """Waits until one more group may start; returns its deadline (a trainer version)."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self.would_block())
            deadline = self.published + self.max_staleness
            self._deadlines[deadline] += 1
            return deadline

    async def release(self, deadline: int) -> None:
        """An admitted group will not be trained (filtered, failed, stale): free its place."""
        async with self._cond:
            self._remove(deadline)
            self._cond.notify_all()

    # ------------------------------------------------------------------ trainer side

    def fits(self, batch: Iterable[int], deadline: int) -> bool:
        """Whether a complete group with `deadline` may join a batch holding `batch` deadlines.

        True unless taking it would leave too few places for groups that (*) forces into this
        step — those with an earlier deadline that are still running or not yet chosen.
        """
        batch = list(batch)
        left = self.groups_per_step - len(batch) - 1
        if left < 0:
            return False
        for d in sorted({d for d in self._deadlines if d < deadline}):
            if self._forced(d) - sum(b <= d for b in batch) > left:
                return False
        return True

    async def step(self, batch: Iterable[int]) -> None:
        """The trainer took one optimizer step on groups with these deadlines."""
        async with self._cond:
            for deadline in batch:
                self._remove(deadline)
            self.trained += 1
            self._cond.notify_all()

    async def publish(self, version: int) -> None:
        """The engine now samples with `version`; groups with later deadlines may start."""
        async with self._cond:
            self.published = version
            self._cond.notify_all()

    def _remove(self, deadline: int) -> None:
        if self._deadlines[deadline] <= 0:
            raise ValueError(f"no outstanding group has deadline {deadline}")
        self._deadlines[deadline] -= 1
        if not self._deadlines[deadline]:
            del self._deadlines[deadline]


class StragglerLimit:
    """How long a group may run before a trainer that is blocked on it may drop it.

    The limit is `factor` x the median rollout time (admission to last member's end) of the
    latest `window` groups that finished; None until `min_observed` of them have. The first
    groups to finish are the fast ones (the slow ones of the same start have not finished
    yet), so an early median is too low: with 8 groups observed instead of 32, 24-step runs
    of the benchmark's workload dropped twice as many groups for the same throughput.

    Args:
      factor: multiple of the median (> 1).
      window: how many recent groups the median is over.
      min_observed: groups that must have finished before any limit applies.
    """

    def __init__(self, factor: float = STRAGGLER_FACTOR, window: int = 128, min_observed: int = 32):
        if not factor > 1.0:
            raise ValueError(f"straggler factor must be > 1, got {factor}")
        self.factor = factor
        self.min_observed = min_observed
        self._recent: collections.deque[float] = collections.deque(maxlen=window)

    def observe(self, rollout_s: float) -> None:
        """A group finished after `rollout_s` seconds (kept or filtered alike)."""
        self._recent.append(rollout_s)

    def limit_s(self) -> float | None:
        """Seconds a group may run before it counts as a straggler; None while unknown."""
        if len(self._recent) < self.min_observed:
            return None
        return self.factor * statistics.median(self._recent)
