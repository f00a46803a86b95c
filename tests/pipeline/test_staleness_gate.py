"""`StalenessGate` and `Accounting` on their own: properties over random schedules (hypothesis).

The gate is driven here exactly as the pipeline drives it — admit while `would_block()` is
False, groups complete (or are dropped) in any order, the trainer fills each batch earliest
deadline first with `fits` — under schedules hypothesis chooses. Properties: no trained group
is staler than `max_staleness` (tokens are at least as new as the version at admission), the
trainer never waits on nothing (no deadlock), and at most `(max_staleness + 1) * gps` groups
are ever outstanding — also when running groups that block a step are dropped (stragglers).
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentax.pipeline import Accounting, AccountingError, StalenessGate


def _fill(gate: StalenessGate, pool: list[int]) -> list[int] | None:
    """The pipeline's batch rule: complete groups by deadline while they fit; None if short."""
    batch: list[int] = []
    for deadline in sorted(pool):
        if len(batch) < gate.groups_per_step and gate.fits(batch, deadline):
            batch.append(deadline)
    return batch if len(batch) == gate.groups_per_step else None


async def _simulate(max_staleness: int, gps: int, seed: int, p_drop: float, steps: int,
                    drop_blockers: bool = False):
    rng = random.Random(seed)
    gate = StalenessGate(max_staleness, gps)
    running: list[tuple[int, int]] = []  # (deadline, version at admission)
    pool: list[tuple[int, int]] = []  # complete, waiting for the trainer
    trained: list[tuple[int, int]] = []  # (trainer version, version at admission)
    most_outstanding = 0
    while gate.trained < steps:
        while not gate.would_block():
            deadline = await gate.acquire()
            assert deadline == gate.published + max_staleness
            running.append((deadline, gate.published))
        most_outstanding = max(most_outstanding, gate.outstanding)
        batch = _fill(gate, [d for d, _ in pool])
        if batch is not None and (not running or rng.random() < 0.5):
            for d in batch:
                item = next(x for x in pool if x[0] == d)
                pool.remove(item)
                trained.append((gate.trained, item[1]))
            await gate.step(batch)
            await gate.publish(gate.trained)
            continue
        assert running, "the trainer waits but nothing is running: deadlock"
        if drop_blockers and batch is None and len(pool) >= gps and rng.random() < 0.5:
            # The pipeline's straggler drop: complete groups could fill the step, but a
            # running one with an earlier deadline blocks them; drop the earliest-deadline one.
            blocker = min(running)
            running.remove(blocker)
            await gate.release(blocker[0])
            assert _fill(gate, [d for d, _ in pool]) is not None or running
            continue
        item = running.pop(rng.randrange(len(running)))  # any group may finish next
        if rng.random() < p_drop:
            await gate.release(item[0])  # filtered or failed
        else:
            pool.append(item)
    return trained, most_outstanding


@settings(max_examples=150, deadline=None)
@given(
    max_staleness=st.integers(0, 3),
    gps=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    p_drop=st.sampled_from([0.0, 0.2, 0.6]),
    drop_blockers=st.booleans(),
)
def test_no_admitted_group_goes_stale_and_nothing_deadlocks(max_staleness, gps, seed, p_drop,
                                                            drop_blockers):
    trained, most_outstanding = asyncio.run(
        _simulate(max_staleness, gps, seed, p_drop, steps=12, drop_blockers=drop_blockers))
    assert len(trained) == 12 * gps
    assert all(version - admitted <= max_staleness for version, admitted in trained)
    assert most_outstanding <= (max_staleness + 1) * gps


def test_staleness_zero_admits_one_step_at_a_time():
    async def main():
        gate = StalenessGate(0, 2)
        deadlines = [await gate.acquire(), await gate.acquire()]
        assert deadlines == [0, 0] and gate.would_block()
        await gate.release(0)  # a dropped group's place is handed back
        assert not gate.would_block()
        deadlines.append(await gate.acquire())
        assert gate.fits([], 0) and gate.fits([0], 0) and not gate.fits([0, 0], 0)
        await gate.step([0, 0])
        assert gate.would_block()  # the trainer stepped, but the weights are not published
        await gate.publish(1)
        assert await gate.acquire() == 1

    asyncio.run(main())


def test_trainer_waits_for_a_straggler_whose_deadline_has_come():
    async def main():
        gate = StalenessGate(1, 1)
        old = await gate.acquire()  # deadline 1: admitted at version 0
        assert old == 1
        # Version 0 -> 1 with the old group still running: a fresh group (deadline 1 too,
        # admitted at 0) is trained at 0, then the straggler must be the next batch.
        fresh = await gate.acquire()
        assert gate.fits([], fresh)
        await gate.step([fresh])
        await gate.publish(1)
        newer = await gate.acquire()  # deadline 2
        assert newer == 2
        assert not gate.fits([], newer)  # the straggler (deadline 1) must go first
        assert gate.fits([], old)

    asyncio.run(main())


def test_gate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessGate(-1, 1)
    with pytest.raises(ValueError, match="groups_per_step"):
        StalenessGate(0, 0)

    async def release_unknown():
        await StalenessGate(1, 1).release(5)

    with pytest.raises(ValueError, match="no outstanding group"):
        asyncio.run(release_unknown())


# ---------------------------------------------------------------------------- accounting


@given(st.lists(st.sampled_from(["start", "train", "filter", "fail"]), max_size=60))
def test_accounting_balances_exactly_when_every_started_episode_ended(events):
    acc = Accounting()
    ended = 0
    for event in events:
        if event == "start":
            acc.started += 1
        elif ended < acc.started:
            ended += 1
            if event == "train":
                acc.trained += 1
            elif event == "filter":
                acc.filtered["all_equal_rewards"] += 1
            else:
                acc.failed["timeout"] += 1
    assert acc.in_flight == acc.started - ended
    acc.check(finished=False)  # never negative while running
    if acc.in_flight:
        with pytest.raises(AccountingError, match="does not balance"):
            acc.check()
    else:
        acc.check()
    summary = acc.summary()
    assert summary["started"] == summary["trained"] + sum(summary["filtered"].values()) + sum(
        summary["failed"].values()) + summary["in_flight"]


def test_accounting_catches_an_episode_counted_twice():
    acc = Accounting(started=2, trained=2)
    acc.failed["cancelled"] += 1  # the same episode counted as trained and failed
    with pytest.raises(AccountingError):
        acc.check(finished=False)
