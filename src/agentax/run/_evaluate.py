"""Per-episode metrics, their aggregation, and held-out evaluation with the engine.

Every episode yields `episode_metrics(trajectory)`: its `reward`, `success` (reward > 0), the
agent's `turns` and `parse_errors`, and whatever the environment reported in
`StepResult.info["metrics"]` (the collector gathers them in `Trajectory.info["metrics"]`).
`agentax train` averages them per RL step and per evaluation, with no task-specific code
(`aggregate`: an episode that does not report a name counts 0; a step where none does has no
value for it).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentax.records import SamplingParams, Task, Trajectory, TrajectoryStatus
from agentax.rollout import Collector, CollectorConfig, cut_short, episode_seed
from agentax.run._build import build_roles

__all__ = ["CORE_METRICS", "EvalResult", "aggregate", "episode_metrics", "evaluate", "evaluate_config",
           "task_metric_names"]

CORE_METRICS = ("success", "reward", "turns", "parse_errors")
"""Per-episode numbers every task has; the environment's own come after them."""


def episode_metrics(traj: Trajectory) -> dict[str, float]:
    """The numbers of one finished episode (core ones, then the environment's)."""
    out = {
        "success": float(traj.reward > 0),
        "reward": float(traj.reward),
        "turns": float(len(traj.turns)),
        "parse_errors": float(sum(len(t.action.parse_errors) for t in traj.turns)),
    }
    for key, value in dict(traj.info.get("metrics", {})).items():
        out.setdefault(str(key), float(value))
    return out


def aggregate(episodes: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over all the episodes (core metrics first).

    An episode that does not report a name counts 0 for it, so a flag or a count reported only
    when it happens gives its rate, not 1.0 (the mean of the episodes that reported it). A name
    that no episode reports is absent from the result: never a 0, never an earlier value.
    """
    sums: dict[str, float] = collections.defaultdict(float)
    count = 0
    for m in episodes:
        count += 1
        for key, value in m.items():
            sums[key] += value
    order = [k for k in CORE_METRICS if k in sums] + sorted(k for k in sums if k not in CORE_METRICS)
    return {k: sums[k] / count for k in order}


def task_metric_names(metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """The environment-reported names among `metrics` (not the core ones)."""
    return tuple(k for k in metrics if k not in CORE_METRICS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalResult:
    """Held-out numbers of one policy, greedy or sampled."""

    mode: str
    """'greedy' or 'sampled'."""
    metrics: Mapping[str, float]
    """Mean per-episode metrics (success, reward, turns, parse_errors, the environment's)."""
    episodes: int
    failed: int
    """Episodes that ended in an error status (timeouts, env errors...)."""
    cut: int = 0
    """Episodes truncated by the collector's own limits (max_turns, max_episode_tokens, a full
    slot), not by the environment: the limits, not the policy, ended them."""
    policy_version: int
    seconds: float
    examples: tuple[Trajectory, ...] = ()
    """The first episodes, in task order (`evaluate(keep=)`): the run's transcripts."""

    @property
    def success_rate(self) -> float:
        """Fraction of episodes with reward > 0."""
        return float(self.metrics.get("success", 0.0))

    @property
    def reward_mean(self) -> float:
        return float(self.metrics.get("reward", 0.0))

    def to_metrics(self, prefix: str = "eval") -> dict[str, float]:
        p = f"{prefix}/{self.mode}"
        return {**{f"{p}/{k}": v for k, v in self.metrics.items()}, f"{p}/episodes": self.episodes,
                f"{p}/cut_short": self.cut}

    def line(self) -> str:
        extra = "".join(f"  {k} {v:.3g}" for k, v in self.metrics.items()
                        if k not in ("success", "reward"))
        cut = f"{self.cut} cut short by collector limits, " if self.cut else ""
        return (f"{self.mode:>7}: success {100 * self.success_rate:5.1f}%  reward "
                f"{self.reward_mean:.3f}{extra}  ({self.episodes} episodes, "
                f"{self.failed} failed, {cut}{self.seconds:.1f} s)")


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
    keep: int = 0,
    split: bool = True,
    roles: Mapping[str, Any] | None = None,
) -> list[EvalResult]:
    """Runs every task once greedily (if `greedy`) and `samples` times sampled.

    Episodes run concurrently (at most `max_concurrency`), batched by the engine. Each result
    keeps its first `keep` episodes (`EvalResult.examples`). With several processes each runs
    its contiguous share of the tasks (same seeds as one process would use) and the results
    are combined over all of them (a collective: every process calls this, at the same point
    of the run). `split=False` runs every task here and combines nothing: for an evaluation
    that overlaps training, whose own collectives run on another thread. `roles` (role ->
    `RolePolicy`) plays a multi-agent environment; each episode is scored by its first
    trained role.
    """
    from agentax.train import gather_objects, local_share

    first = local_share(range(len(tasks))) if split else list(range(len(tasks)))
    start = first[0] if first else 0
    mine = list(tasks)[start:start + len(first)]
    results = []
    modes = ([("greedy", 1)] if greedy else []) + ([("sampled", samples)] if samples else [])
    gate = asyncio.Semaphore(max_concurrency)
    for mode, repeats in modes:
        params = dataclasses.replace(sampling, temperature=0.0) if mode == "greedy" else sampling
        collector = Collector(engine, tokenizer, suite.make_env, suite.make_agent, params,
                              collector_config, reward_fn=suite.reward_fn, roles=roles)
        version = int(getattr(engine, "policy_version", 0))
        t0 = time.perf_counter()

        async def one(i: int, task: Task, r: int) -> Any:
            async with gate:
                return await collector.run_episode(
                    task, seed=episode_seed(seed + 7919, i, r), group_id=f"eval-{mode}-{i}",
                    sample_index=r)

        trajs = await asyncio.gather(*(one(start + i, t, r) for i, t in enumerate(mine)
                                       for r in range(repeats)))
        ok = (TrajectoryStatus.OK, TrajectoryStatus.TRUNCATED)
        rows = [(episode_metrics(t), t.status not in ok, cut_short(t)) for t in trajs]
        rows = gather_objects(rows) if split else rows
        results.append(EvalResult(
            mode=mode, metrics=aggregate(m for m, _, _ in rows), episodes=len(rows),
            failed=sum(f for _, f, _ in rows), cut=sum(c for _, _, c in rows),
            policy_version=version, seconds=time.perf_counter() - t0,
            examples=tuple(trajs[:keep])))
    return results


async def evaluate_config(cfg, engine, tokenizer, suite, *, greedy=None, samples=None,
                          split: bool = True, snapshot: Any = None) -> list[EvalResult]:
    """`evaluate` on the suite's held-out tasks, as the run config's `eval` section says
    (`greedy` and `samples` override it; `snapshot`: what a 'snapshot:N' role plays)."""
    e = cfg.eval
    return await evaluate(
        engine, tokenizer, suite, suite.eval_tasks, sampling=cfg.sampling,
        collector_config=cfg.collector, greedy=e.greedy if greedy is None else greedy,
        samples=e.samples if samples is None else samples, max_concurrency=e.max_concurrency,
        seed=cfg.run.seed, keep=cfg.tracing.eval_transcripts, split=split,
        roles=build_roles(e.roles or cfg.env.roles, tokenizer, snapshot=snapshot))
