"""Environments for testing and benchmarking remote execution (importable in Ray workers).

`SleepyEnv` stands in for an environment bound by an external system (a sandbox, a browser, a
simulator): blocking calls with a fixed latency, an optional slow start, and fault switches
(hang, crash the process). It is a plain synchronous environment, adapted by
`ensure_async_env`, as most real environments are.
"""

from __future__ import annotations

import os
import time

from agentax.records import Action, Observation, StepResult, Task

__all__ = ["SleepyEnv", "vowel_share"]


def vowel_share(text: str) -> float:
    """A deterministic reward with variance across samples: the share of vowels in `text`."""
    return sum(c in "aeiou" for c in text) / max(len(text), 1)


class SleepyEnv:
    """A multi-turn environment whose calls block for a fixed time.

    Args:
      num_steps: steps per episode (the last one returns done=True).
      step_latency_s / reset_latency_s: blocking time of each call.
      startup_s: blocking time of the constructor (an expensive environment to start).
      step_timeout_s / reset_timeout_s: limits picked up by `ensure_async_env`.
      hang_on: task ids whose first step blocks for an hour (a hung environment).
      crash_on: task ids whose first step kills the hosting process (`os._exit`).

    Observations carry `info={"pid", "instance_episodes"}` so tests can see reuse.
    """

    def __init__(
        self,
        *,
        num_steps: int = 2,
        step_latency_s: float = 0.0,
        reset_latency_s: float = 0.0,
        startup_s: float = 0.0,
        step_timeout_s: float = 30.0,
        reset_timeout_s: float = 30.0,
        hang_on: tuple[str, ...] = (),
        crash_on: tuple[str, ...] = (),
    ) -> None:
        time.sleep(startup_s)
        self.num_steps = num_steps
        self.step_latency_s = step_latency_s
        self.reset_latency_s = reset_latency_s
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.hang_on = frozenset(hang_on)
        self.crash_on = frozenset(crash_on)
        self.episodes = 0
        self._task: Task | None = None
        self._steps = 0

    def _info(self) -> dict:
        return {"pid": os.getpid(), "instance_episodes": self.episodes}

    def reset(self, task: Task) -> Observation:
        time.sleep(self.reset_latency_s)
        self.episodes += 1
        self._task, self._steps = task, 0
        return Observation(content=task.prompt or "go", info=self._info())

    def step(self, action: Action) -> StepResult:
        self._steps += 1
        task_id = self._task.id if self._task is not None else ""
        if self._steps == 1 and task_id in self.crash_on:
            os._exit(13)
        if self._steps == 1 and task_id in self.hang_on:
            time.sleep(3600)
        time.sleep(self.step_latency_s)
        done = self._steps >= self.num_steps
        return StepResult(
            observation=Observation(content="" if done else "again", info=self._info()),
            reward=vowel_share(action.text), done=done,
        )
