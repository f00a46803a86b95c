"""Tasks whose groups keep coming back all-equal: rest them, and say so at most once a minute.

A group whose samples all got the same reward has zero advantage everywhere: the default
`all_equal_rewards` filter drops it, and its episodes were rollout time spent for nothing. A
policy that already solves a task (or never does) keeps producing such groups for it. Instead
of sampling that task at its usual rate, `TaskRest` skips its next admissions -- one after
`rest_after` all-equal groups in a row, doubling with each further one, up to `max_rest` -- so
the other tasks get the rollouts; a group of the task whose rewards differ ends its rest. A
skipped admission starts no episode (nothing is dropped); the pipeline counts it by task
(`Accounting.rested`).

`DropReport` turns the drops into warnings a person can act on: at most one per `interval_s`
(a minute), only while at least `min_share` of the groups finished since the last one were
all-equal, naming the tasks (with the reward their samples shared), the share, what is
resting, and the knobs.

`SuccessStop` ends RL once the policy has converged: when the latest `window` finished
training episodes succeeded (reward > 0) at `rate` or more, the steps still to come would
mostly sample all-equal groups that the filter drops (`PipelineConfig.stop_success`).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

__all__ = ["DropReport", "SuccessStop", "TaskRest"]

ALL_EQUAL = "all_equal_rewards"


@dataclasses.dataclass
class _Streak:
    equal: int = 0  # all-equal groups in a row
    rest_left: int = 0  # admissions still to skip


class TaskRest:
    """Which tasks rest, and for how many of their admissions.

    Args:
      rest_after: all-equal groups in a row after which a task rests (0: never).
      max_rest: the most admissions of one task skipped in a row.
    """

    def __init__(self, rest_after: int, max_rest: int) -> None:
        self.rest_after, self.max_rest = rest_after, max_rest
        self._tasks: dict[str, _Streak] = collections.defaultdict(_Streak)

    def observe(self, task_id: str, all_equal: bool) -> None:
        """A finished, non-failed group of `task_id`: all-equal (dropped) or not."""
        streak = self._tasks[task_id]
        if not all_equal:
            streak.equal = streak.rest_left = 0
            return
        streak.equal += 1
        if self.rest_after and streak.equal >= self.rest_after:
            streak.rest_left = min(self.max_rest, 2 ** (streak.equal - self.rest_after))

    def skip(self, task_id: str) -> bool:
        """Whether to skip this admission of `task_id` (it then counts one off its rest)."""
        streak = self._tasks.get(task_id)
        if streak is None or streak.rest_left <= 0:
            return False
        streak.rest_left -= 1
        return True

    def resting(self) -> list[str]:
        """Tasks resting now."""
        return [t for t, s in self._tasks.items() if s.rest_left > 0]


class DropReport:
    """Rate-limited, specific warnings about groups dropped for all-equal rewards.

    Args:
      interval_s: at most one warning per this many seconds.
      min_share: warn only when at least this share of the groups finished since the last
        warning (or the start) were all-equal.
      min_groups: ... and at least this many of them were.
      clock: monotonic seconds (tests pass a virtual clock).
    """

    def __init__(self, *, interval_s: float = 60.0, min_share: float = 0.5, min_groups: int = 8,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.min_share, self.min_groups = interval_s, min_share, min_groups
        self.clock = clock
        self._last: float | None = None  # when the last warning was given
        self._since = clock()
        self._groups = 0
        self._equal: collections.Counter = collections.Counter()  # task -> all-equal groups
        self._rewards: dict[str, set[float]] = collections.defaultdict(set)
        self._episodes = 0

    def observe(self, task_id: str, dropped_equal: bool, episodes: int,
                reward: float | None = None) -> None:
        """One finished group (failed groups are the breaker's, not counted here)."""
        self._groups += 1
        if dropped_equal:
            self._equal[task_id] += 1
            self._episodes += episodes
            if reward is not None and len(self._rewards[task_id]) < 4:
                self._rewards[task_id].add(round(float(reward), 4))

    def due(self) -> bool:
        """Whether a warning is due now (and allowed by the rate limit)."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        equal = sum(self._equal.values())
        return equal >= self.min_groups and equal >= self.min_share * self._groups

    def message(self, *, resting: list[str], rested: collections.Counter, knobs: str) -> str:
        """The warning for the groups seen since the last one; starts a new window."""
        now = self.clock()
        equal = sum(self._equal.values())
        tasks = ", ".join(
            f"{t} ({n}, reward {'/'.join(f'{r:g}' for r in sorted(self._rewards[t]))})"
            for t, n in self._equal.most_common(6))
        more = len(self._equal) - 6
        text = (f"in the last {now - self._since:.0f} s, {equal} of {self._groups} groups "
                f"({100 * equal / max(self._groups, 1):.0f}%, {self._episodes} episodes) were "
                f"dropped because every sample got the same reward (no learning signal); by "
                f"task: {tasks}{f' and {more} more tasks' if more > 0 else ''}")
        if resting:
            shown = ", ".join(resting[:6]) + (f" and {len(resting) - 6} more" if len(resting) > 6
                                              else "")
            text += (f"; resting {len(resting)} task(s) ({shown}), {sum(rested.values())} "
                     f"admissions skipped so far")
        self._last, self._since = now, now
        self._groups = self._episodes = 0
        self._equal.clear()
        self._rewards.clear()
        return f"{text}; {knobs}"


class SuccessStop:
    """Whether the latest `window` finished training episodes succeeded at `rate` or more.

    Args:
      rate: the success rate (reward > 0) that ends RL; 0 never does.
      window: how many of the latest finished episodes it is measured over (all of a finished
        group's episodes, whatever becomes of the group; a failed episode is a failure).
    """

    def __init__(self, rate: float, window: int) -> None:
        self.rate, self.window = rate, window
        self._latest: collections.deque[bool] = collections.deque(maxlen=window)

    def observe(self, rewards) -> None:
        """The rewards of one finished group's episodes (a failed episode: reward <= 0)."""
        self._latest.extend(float(r) > 0 for r in rewards)

    @property
    def success(self) -> float:
        """The success rate over the latest (up to `window`) episodes."""
        return sum(self._latest) / len(self._latest) if self._latest else 0.0

    def reached(self) -> bool:
        """A full window whose success rate is at least `rate` (never when `rate` is 0)."""
        return (self.rate > 0 and len(self._latest) == self.window
                and self.success >= self.rate)
