"""The pipeline's screen of finished groups: failed members sink a group, the configured
filters judge each (task, role) part, and what is dropped is counted, traced and warned about.

A mixin of `Pipeline` (pipeline/_pipeline.py), which owns the state it reads: `config`,
`accounting`, `tracer`, `_rest` (resting confident tasks), `_drops` (the rate-limited
warning), `_success` and `_stop_early` (`stop_success`), the drop streaks, `_waiting_since`
and `_fail`.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from agentax.pipeline._breaker import RunFailed
from agentax.pipeline._steps import _FILTERS, _TRAINABLE, drop_all_equal_rewards, split_roles
from agentax.records import Group, Trajectory
from agentax.trace import names

__all__ = ["GroupScreening"]

log = logging.getLogger("agentax.pipeline._pipeline")  # the pipeline's own warnings


class GroupScreening:
    """Screening steps of the pipeline (see the module docstring)."""

    def _observe_screened(self, group: Group, kept: Group | None) -> None:
        """Feeds a screened, non-failed group to the task rest and the rate-limited warning."""
        equal = kept is None and bool(self.config.filters) and \
            drop_all_equal_rewards(group) is not None
        self._rest.observe(group.task_id, equal)
        self._drops.observe(group.task_id, equal, len(group.trajectories),
                            group.trajectories[0].reward if group.trajectories else None)
        if self._drops.due():
            rest = self.config.rest_confident_after
            log.warning("%s", self._drops.message(
                resting=self._rest.resting(), rested=self.accounting.rested, knobs=(
                    "a task the policy already solves rests after "
                    f"pipeline.rest_confident_after={rest} such groups in a row (0 never rests; "
                    f"pipeline.rest_confident_max={self.config.rest_confident_max} caps a rest); "
                    "one it fails every time needs a warm start (sft.steps, init.from_run) or "
                    "more varied samples (sampling.temperature, pipeline.group_size); "
                    "pipeline.filters=[] trains on such groups anyway"
                    + ("" if self.config.stop_success else
                       "; a policy that solves most tasks can end RL early: "
                       "pipeline.stop_success=0.95 stops once the latest "
                       f"{self.config.stop_window} training episodes succeed at 95%"))))

    def _account_dropped(self, group: Group, reason: str) -> None:
        for traj in group.trajectories:
            self.accounting.statuses[traj.status.value] += 1
            self.accounting.filtered[reason] += 1
        # `agentax doctor` names a run whose groups were filtered away, and which tasks.
        self.tracer.instant(names.GROUP_DROPPED, track=names.COLLECTOR_TRACK, args={
            "reason": reason, "task_id": group.task_id, "episodes": len(group.trajectories)})

    def _screen(self, group: Group) -> Group | None:
        """Failed members sink the group (counted by status); then the configured filters."""
        filtered_before = sum(self.accounting.filtered.values())
        kept = self._screen_group(group)
        failed = any(t.status not in _TRAINABLE for t in group.trajectories)
        if kept is not None:
            self._drop_streak = self._filtered_streak = 0
        else:
            self._drop_streak += 1
            if not failed:
                self._filtered_streak += sum(self.accounting.filtered.values()) - filtered_before
        if not failed:  # (failing episodes are the breaker's to report)
            self._observe_screened(group, kept)
        self._success.observe(t.reward if t.status in _TRAINABLE else 0.0
                              for t in group.trajectories)
        if self._success.reached():
            cfg = self.config
            self._stop_early(
                f"the last {cfg.stop_window} training episodes succeeded at "
                f"{100 * self._success.success:.1f}% >= pipeline.stop_success="
                f"{cfg.stop_success:g}")
        limit = self.config.max_dropped_episodes
        if limit and self._filtered_streak >= limit:
            self._filtered_streak = 0
            self._fail(RunFailed(
                "all_filtered", f"the last {limit} episodes were all dropped by "
                f"pipeline.filters {list(self.config.filters)} (filtered so far "
                f"{dict(self.accounting.filtered)}) and no step could happen",
                knob="warm-start the policy (sft.steps, init.from_run) so that a group's samples "
                "differ, or pipeline.filters=[] to train on them anyway, or "
                f"pipeline.max_dropped_episodes (now {limit})"))
        if kept is not None and self._waiting_since is not None:
            self._waiting_since = time.perf_counter()  # a group reached the trainer: progress
        return kept

    def _screen_group(self, group: Group) -> Group | None:
        failed = [t for t in group.trajectories if t.status not in _TRAINABLE]
        if failed:
            for traj in group.trajectories:
                self.accounting.statuses[traj.status.value] += 1
                if traj.status in _TRAINABLE:
                    self.accounting.filtered["group_member_failed"] += 1
                else:
                    self.accounting.failed[traj.status.value] += 1
            return None
        # Filters judge each (task, role) group on its own (a multi-agent task's roles are
        # separate GRPO groups); a task keeps the roles that pass.
        kept: list[Trajectory] = []
        for part in split_roles(group):
            reason = next((r for r in (_FILTERS[n](part) for n in self.config.filters)
                           if r is not None), None)
            if reason is not None:
                self._account_dropped(part, reason)
            else:
                kept.extend(part.trajectories)
        if not kept:
            return None
        if len(kept) == len(group.trajectories):
            return group
        return dataclasses.replace(group, trajectories=tuple(kept))
