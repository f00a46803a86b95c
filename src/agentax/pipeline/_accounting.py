"""Episode accounting: every started episode is trained on, filtered, or failed — by reason.

The invariant `started == trained + filtered + failed + in_flight` holds at every moment and
`in_flight == 0` at the end of a run; `check()` raises if an episode went missing.
"""

from __future__ import annotations

import collections
import dataclasses

__all__ = ["Accounting", "AccountingError"]


class AccountingError(RuntimeError):
    """An episode was lost: the books do not balance."""


@dataclasses.dataclass
class Accounting:
    """Counts episodes through the pipeline."""

    started: int = 0
    trained: int = 0
    filtered: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """Episodes of groups dropped on purpose (all-equal rewards, staleness, ...) by reason."""
    failed: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """Episodes that ended in an error status, by status (counted when their group is dropped)."""
    statuses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """Final status of every finished episode (trained or not)."""
    rested: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    """Group admissions skipped because their task was resting (its groups kept coming back
    all-equal: `PipelineConfig.rest_confident_after`), by task. No episode was started for
    them, so they are outside the episode invariant."""

    @property
    def num_filtered(self) -> int:
        return sum(self.filtered.values())

    @property
    def num_failed(self) -> int:
        return sum(self.failed.values())

    @property
    def in_flight(self) -> int:
        return self.started - self.trained - self.num_filtered - self.num_failed

    def check(self, *, finished: bool = True) -> None:
        """Raises AccountingError if episodes are unaccounted for (or still in flight at end)."""
        if self.in_flight < 0 or (finished and self.in_flight != 0):
            raise AccountingError(
                f"episode accounting does not balance: started={self.started} trained="
                f"{self.trained} filtered={dict(self.filtered)} failed={dict(self.failed)} "
                f"(in_flight={self.in_flight})"
            )

    def summary(self) -> dict:
        return {
            "started": self.started,
            "trained": self.trained,
            "filtered": dict(self.filtered),
            "failed": dict(self.failed),
            "statuses": dict(self.statuses),
            "rested": dict(self.rested),
            "in_flight": self.in_flight,
        }
