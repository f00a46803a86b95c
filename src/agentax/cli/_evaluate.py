"""Held-out evaluation: run the agent on tasks with the engine, report success and reward."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentax.records import SamplingParams, Task, TrajectoryStatus
from agentax.rollout import Collector, CollectorConfig, episode_seed

__all__ = ["EvalResult", "evaluate", "tool_rate"]


def tool_rate(trajectories: Sequence[Any]) -> float:
    """Fraction of trajectories with at least one tool call."""
    if not trajectories:
        return 0.0
    return float(np.mean([any(t.action.tool_calls for t in traj.turns) for traj in trajectories]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalResult:
    """Held-out numbers of one policy, greedy or sampled."""

    mode: str
    """'greedy' or 'sampled'."""
    success_rate: float
    """Fraction of episodes with reward > 0."""
    reward_mean: float
    tool_rate: float
    """Fraction of episodes that called a tool."""
    episodes: int
    failed: int
    """Episodes that ended in an error status (timeouts, env errors...)."""
    policy_version: int
    seconds: float

    def to_metrics(self, prefix: str = "eval") -> dict[str, float]:
        p = f"{prefix}/{self.mode}"
        return {f"{p}/success": self.success_rate, f"{p}/reward": self.reward_mean,
                f"{p}/tool_rate": self.tool_rate, f"{p}/episodes": self.episodes}

    def line(self) -> str:
        return (f"{self.mode:>7}: success {100 * self.success_rate:5.1f}%  reward "
                f"{self.reward_mean:.3f}  tool use {100 * self.tool_rate:5.1f}%  "
                f"({self.episodes} episodes, {self.seconds:.1f} s)")


async def evaluate(
    engine: Any,
    tokenizer: Any,
    suite: Any,
    tasks: Sequence[Task],
    *,
    sampling: SamplingParams,
    collector_config: CollectorConfig,
    greedy: bool,
    samples: int = 1,
    max_concurrency: int = 32,
    seed: int = 0,
) -> list[EvalResult]:
    """Runs every task once greedily (if `greedy`) and `samples` times sampled.

    Episodes run concurrently (at most `max_concurrency`), batched by the engine.
    """
    results = []
    modes = ([("greedy", 1)] if greedy else []) + ([("sampled", samples)] if samples else [])
    gate = asyncio.Semaphore(max_concurrency)
    for mode, repeats in modes:
        params = dataclasses.replace(sampling, temperature=0.0) if mode == "greedy" else sampling
        collector = Collector(engine, tokenizer, suite.make_env, suite.make_agent, params,
                              collector_config)
        version = int(getattr(engine, "policy_version", 0))
        t0 = time.perf_counter()

        async def one(i: int, task: Task, r: int) -> Any:
            async with gate:
                return await collector.run_episode(
                    task, seed=episode_seed(seed + 7919, i, r), group_id=f"eval-{mode}-{i}",
                    sample_index=r)

        trajs = await asyncio.gather(*(one(i, t, r) for i, t in enumerate(tasks)
                                       for r in range(repeats)))
        rewards = np.asarray([t.reward for t in trajs], np.float32)
        ok = (TrajectoryStatus.OK, TrajectoryStatus.TRUNCATED)
        results.append(EvalResult(
            mode=mode, success_rate=float((rewards > 0).mean()) if len(trajs) else 0.0,
            reward_mean=float(rewards.mean()) if len(trajs) else 0.0,
            tool_rate=tool_rate(trajs), episodes=len(trajs),
            failed=sum(t.status not in ok for t in trajs), policy_version=version,
            seconds=time.perf_counter() - t0))
    return results
