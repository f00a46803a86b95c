"""Hooks: the work a run does at its RL steps, each with a frequency.

`train` runs its own hooks first, in this order, then the caller's (`train(..., hooks=[...])`),
after every RL step whose number is a multiple of the hook's `every`:

* `transcripts` (every step): a sample of the step's trained episodes to transcripts.jsonl;
* `metrics` (every step): the step's row (phase `rl`) to metrics.jsonl;
* `console` (every step): the progress line or bar;
* `checkpoint` (`run.checkpoint_every`): the trainer to RUN_DIR/checkpoints;
* `eval` (`eval.every`, before the last step): a greedy evaluation overlapping training.

The doctor's report and the curves are written once, at the end of the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Hook", "StepInfo"]


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a hook sees after one RL step."""

    step: int
    """The step just trained (1 is the first)."""
    total_steps: int
    """`run.steps`."""
    metrics: dict[str, Any]
    """The step's row of metrics.jsonl (filled by the `metrics` hook, which runs first of all
    but `transcripts`): success, reward, loss, staleness, traj_per_s, ..."""
    record: Any
    """The pipeline's `StepRecord`."""
    groups: Sequence[Any]
    """The groups the step trained on."""


@dataclasses.dataclass(frozen=True)
class Hook:
    """`fn(info: StepInfo)` after every `every`-th RL step (`every` <= 0: never).

    Called on the pipeline's event loop thread, between two steps: a slow hook delays the
    next step's logging, not the sampling that overlaps it. An exception fails the run."""

    fn: Callable[[StepInfo], Any]
    every: int = 1
    name: str = ""

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def __call__(self, info: StepInfo) -> Any:
        return self.fn(info)


def run_hooks(hooks: Sequence[Hook], info: StepInfo) -> None:
    for hook in hooks:
        if hook.due(info.step):
            hook(info)
