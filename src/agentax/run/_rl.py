"""The RL phase of `train`: evaluate, RL through the pipeline (with the run's hooks), evaluate."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentax import _aio as aio
from agentax._executors import lower_thread_priority
from agentax.pipeline import RunFailed
from agentax.records import Group, Trajectory, TrajectoryStatus
from agentax.rollout import Collector
from agentax.run._build import build_roles, build_snapshot
from agentax.run._config import RunConfig
from agentax.run._console import ConsoleView
from agentax.run._evaluate import aggregate, episode_metrics, evaluate_config, task_metric_names
from agentax.run._hooks import Hook, StepInfo, run_hooks
from agentax.run._reporter import Reporter, logged_phase, phase_rows, report_eval
from agentax.run._rundir import CHECKPOINT_DIR, RunCheckpointer
from agentax.run._signals import Interrupted, StopGuard, hard_exit, interrupted_by

__all__ = ["PRECOMPILE_MAX_KERNELS", "RLPhase", "close_shared", "precompile_rl"]

log = logging.getLogger(__name__)


class RLPhase:
    """One segment of RL: steps `start_step + 1 .. run.steps` through the pipeline, with the
    evaluations before (once per run) and after; `run()` returns its part of the summary.

    The run's per-step work is hooks (`agentax.run.Hook`): the built-in ones (`builtin_hooks`)
    first, then `hooks`."""

    def __init__(self, cfg: RunConfig, rep: Reporter, trainer, engine, tokenizer, suite,
                 start_step: int, start_group: int, guard: StopGuard,
                 checkpointer: RunCheckpointer, hooks: Sequence[Hook] = ()):
        from agentax.pipeline import Pipeline

        self.cfg, self.rep, self.trainer, self.engine = cfg, rep, trainer, engine
        self.tokenizer, self.suite, self.guard = tokenizer, suite, guard
        self.start_step, self.checkpointer = start_step, checkpointer
        self.resumed = checkpointer.saved_step is not None
        self.out: dict[str, Any] = {}
        self.transcripts = rep.transcripts(tokenizer, segment=start_step)
        self.evals: list[asyncio.Task] = []
        self.trained = 0
        self.sampled: list[dict[str, float]] = []
        self.view: ConsoleView | None = None
        self._view_made = False
        self._task_keys: tuple[str, ...] = ()
        self.hooks = [*self.builtin_hooks(), *hooks]
        # A 'snapshot:N' role: an engine of its own on the trainer's weights, advanced at
        # every N-th publish (a resumed run's snapshot restarts from the resumed weights).
        self.snapshot = build_snapshot(cfg, trainer, tokenizer, version=start_step)
        collector = Collector(engine, tokenizer, suite.make_env, suite.make_agent, cfg.sampling,
                              cfg.collector, reward_fn=suite.reward_fn,
                              roles=build_roles(cfg.env.roles, tokenizer, snapshot=self.snapshot))
        self.pipeline = Pipeline(collector, guard.trainer(trainer), engine,
                                 list(suite.train_tasks), cfg.pipeline,
                                 on_episode=self._on_episode, on_trained=self._on_trained,
                                 start_version=start_step, start_group=start_group)
        if self.snapshot is not None:
            self.pipeline.publish_fn = self.snapshot.publisher(self.pipeline.publish_fn)
        saved = f"`agentax train {rep.run_dir}` continues from the newest checkpoint"
        self.pipeline.on_loop_stuck = lambda error: hard_exit(
            1, f"agentax train: error: {error}; the event loop stayed blocked, so the run exited "
            f"without a new checkpoint; after the fix, {saved}")

    # ------------------------------------------------------------------ hooks

    def builtin_hooks(self) -> list[Hook]:
        cfg = self.cfg
        return [Hook(self._transcripts_hook, 1, "transcripts"),
                Hook(self._metrics_hook, 1, "metrics"),
                Hook(self._console_hook, 1, "console"),
                Hook(lambda info: self.checkpoint(), cfg.run.checkpoint_every, "checkpoint"),
                Hook(self._eval_hook, cfg.eval.every, "eval")]

    def _transcripts_hook(self, info: StepInfo) -> None:
        self.transcripts.trained(info.step, info.groups,
                                 skipped=bool(getattr(info.record.metrics, "skipped", False)))

    def _metrics_hook(self, info: StepInfo) -> None:
        record = info.record
        self.trained += sum(1 for _ in record.group_ids) * self.cfg.pipeline.group_size
        # Over every episode finished since the last step (filtered groups included).
        episodes = aggregate(self.sampled)
        self._task_keys = task_metric_names(episodes)
        count = len(self.sampled)
        self.sampled.clear()
        m = record.metrics
        metrics = {
            "phase": "rl", "policy_version": record.policy_version, **episodes,
            "episodes": count,
            # Over the groups this step trained on (all-equal groups are filtered out).
            "success_trained": record.success_rate, "reward_trained": record.reward_mean,
            "staleness": max(record.staleness, default=0),
            "staleness_mean": float(np.mean(record.staleness)) if record.staleness else 0.0,
            "traj_per_s": self.trained / max(record.wall_s, 1e-9),
            "train_s": record.train_s, "trainer_wait_s": record.trainer_wait_s,
        }
        if m is not None:
            # `kl`: to the reference policy (trainer.kl_coef); `approx_kl`: to the proximal
            # one, 0 with trainer.ppo_epochs=1 (one update per batch), as TrainMetrics names them
            metrics.update(loss=m.loss, entropy=m.entropy, kl=m.kl, approx_kl=m.approx_kl,
                           grad_norm=m.grad_norm, skipped=m.skipped)
        info.metrics.update(self.rep.log(record.step, metrics))

    def _console_hook(self, info: StepInfo) -> None:
        if not self._view_made:
            keys = ("success", "reward", *self._task_keys[:2], "staleness",
                    "traj_per_s")
            self.view, self._view_made = self.rep.view(self.cfg.run.steps, keys, "rl"), True
        if self.view is not None:
            self.view.update(info.step - 1, info.metrics)

    def _eval_hook(self, info: StepInfo) -> None:
        if info.step < self.cfg.run.steps:
            self.evals.append(asyncio.get_running_loop().create_task(self._mid_eval(info.step)))

    async def _mid_eval(self, step: int) -> None:
        # Overlaps training, whose collectives run on the trainer's thread: not split.
        results = await evaluate_config(self.cfg, self.engine, self.tokenizer, self.suite,
                                        greedy=True, samples=0, split=False,
                                        snapshot=self.snapshot)
        for r in results:
            self.rep.log(step, {"phase": "eval_mid", "policy_version": r.policy_version,
                                **r.to_metrics()})
        self.transcripts.evaluated("eval_mid", step, results)

    def _on_episode(self, traj) -> None:
        self.sampled.append(episode_metrics(traj))

    def _on_trained(self, record, groups) -> None:
        run_hooks(self.hooks, StepInfo(step=record.step, total_steps=self.cfg.run.steps,
                                       metrics={}, record=record, groups=groups))
        self.guard.step_logged()

    # ------------------------------------------------------------------ the phase

    def checkpoint(self) -> None:
        with self.guard.saving():
            self.checkpointer.save(self.trainer, rl_step=self.pipeline.version,
                                   next_group=self.pipeline.next_group)

    def _close_view(self) -> None:
        if self.view is not None:
            self.view.close()

    async def _main(self) -> Any:
        self.guard.enter_loop(asyncio.current_task())
        try:
            return await self._phase()
        finally:
            await close_shared(self.cfg.collector.close_timeout_s, self.rep.warn)
            self.guard.leave_loop()

    async def _evaluate_report(self, step: int, label: str) -> dict:
        results = await evaluate_config(self.cfg, self.engine, self.tokenizer, self.suite,
                                        snapshot=self.snapshot)
        return report_eval(self.rep, step, label, results, self.transcripts)

    async def _phase(self) -> Any:
        rep, timings = self.rep, self.rep.timings
        t = time.perf_counter()
        # Once per run: also on a resume from step 0 whose first segment stopped before
        # (or during) it, so the pre-RL figures are never lost.
        if self.start_step == 0 and not logged_phase(rep.run_dir, "eval_before"):
            self.out["eval_before"] = await self._evaluate_report(0, "before")
        timings["eval_before_s"] = time.perf_counter() - t
        t = time.perf_counter()
        # (groups dropped for all-equal rewards: the pipeline's own warning, once a minute)
        result = await self.pipeline.arun(max(self.cfg.run.steps - self.start_step, 0))
        timings["rl_s"] = time.perf_counter() - t
        if self.pipeline.stopped_early:
            self.out["stopped_early"] = {"step": self.pipeline.version,
                                         "reason": self.pipeline.stopped_early}
        # Engines take weights in the background (Ray replicas over the object store): the
        # evaluation after RL waits for the last version to reach them.
        if not await asyncio.to_thread(self.engine.wait_published,
                                       self.cfg.scale.start_timeout_s):
            self.rep.warn(f"the last weights did not reach every engine replica within "
                          f"scale.start_timeout_s={self.cfg.scale.start_timeout_s:g} s; the "
                          "evaluation after RL may sample older ones")
        self.checkpoint()  # before the final evaluation, which a kill may interrupt
        self._close_view()
        if self.pipeline.stopped_early:
            self.rep.say(f"rl: stopped after step {self.pipeline.version} of "
                         f"{self.cfg.run.steps}: {self.pipeline.stopped_early}")
        await asyncio.gather(*self.evals)
        t = time.perf_counter()
        self.out["eval_after"] = await self._evaluate_report(self.pipeline.version, "after")
        timings["eval_after_s"] = time.perf_counter() - t
        return result

    def run(self) -> dict:
        rep, guard, ckpt = self.rep, self.guard, self.checkpointer
        try:
            result = aio.run(self._main())
        except RunFailed as e:
            # The pipeline finished the step in flight: the trainer's state is that of
            # pipeline.version, so the run resumes where it stopped.
            self._close_view()
            self.checkpoint()
            if ckpt.saved_step is not None:
                e.extend(f"checkpoint {rep.run_dir / CHECKPOINT_DIR}/step_{ckpt.saved_step} "
                         f"is complete; after the fix, `agentax train {rep.run_dir}` continues "
                         "from it")
            raise
        except BaseException as e:
            if guard.signum is None or not (guard.stopped(e) or isinstance(e, Interrupted)):
                raise
            guard.acknowledge()
            self._close_view()
            self.checkpoint()
            raise Interrupted(guard.signum, f"stopped at RL step {self.pipeline.version} ("
                              f"{interrupted_by(guard.signum)}); checkpoint "
                              f"{rep.run_dir / CHECKPOINT_DIR}/step_{ckpt.saved_step} is "
                              f"complete; continue with `agentax train {rep.run_dir}`") from None
        finally:
            self.transcripts.close()
            if self.snapshot is not None:
                self.snapshot.shutdown()
        # The whole run, across resumed segments (metrics.jsonl was cut back to the checkpoint
        # this segment resumed from, so its rows are the run's); `segment` is this process's.
        out = self.out
        rows = phase_rows(rep.run_dir)
        if "eval_before" not in out and rows.get("eval_before"):
            out["eval_before"] = {k: v for k, v in rows["eval_before"][-1].items()
                                  if k not in ("step", "time", "phase", "wall_s", "policy_version")}
        out.update(rl_steps=len(rows.get("rl", [])),
                   trajectories_trained=result.trajectories_trained,
                   trajectories_per_s=result.trajectories_per_s,
                   trainer_idle_fraction=result.trainer_idle_fraction,
                   accounting=result.accounting.summary(),
                   segment={"resumed_from_step": self.start_step if self.resumed else None,
                            "rl_steps": len(result.steps),
                            "episodes_sampled": result.accounting.started})
        return out


async def close_shared(timeout_s: float, warn: Callable[[str], None]) -> None:
    """Closes what the run's episodes shared on its event loop (MCP sessions, the browser),
    each within `timeout_s`; one that does not close in time is left behind and reported."""
    from agentax.envs import shutdown_browser
    from agentax.tools import close_mcp_connections

    for label in await close_mcp_connections(timeout_s):
        warn(f"the MCP session of '{label}' did not close within {timeout_s:g} s at the end "
             "of the run (collector.close_timeout_s); left behind")
    try:
        await aio.bounded(shutdown_browser(), timeout_s)
    except TimeoutError:
        warn(f"the browser did not close within {timeout_s:g} s at the end of the run "
             "(collector.close_timeout_s); left behind")
    except Exception:  # noqa: BLE001 - a browser that already died has nothing to close
        pass


PRECOMPILE_MAX_KERNELS = 64
"""Engine kernel shapes `train` compiles ahead during SFT; past this it compiles lazily."""


def precompile_rl(cfg: RunConfig, trainer, *, after: Callable[[], Any]) -> threading.Thread:
    """Starts compiling the RL step's kernels on a thread once `after()` returns True (False:
    the run stopped, nothing to compile for), for groups of the configured size whose episodes
    use the whole token budget (shorter real ones may need another length bucket: that one
    compiles at its first step)."""
    length = min(cfg.collector.max_episode_tokens, cfg.trainer.max_seq_len)
    mask = np.r_[np.zeros(1, np.int8), np.ones(length - 1, np.int8)]
    groups = [Group(group_id=f"precompile-{g}", task_id="precompile", trajectories=tuple(
        Trajectory(task_id="precompile", token_ids=np.zeros(length, np.int32), loss_mask=mask,
                   logprobs=np.zeros(length, np.float32), versions=np.zeros(length, np.int32),
                   reward=float(i % 2), status=TrajectoryStatus.OK, sample_index=i)
        for i in range(cfg.pipeline.group_size))) for g in range(cfg.pipeline.groups_per_step)]

    def run() -> None:
        try:
            if after():  # one compile at a time beside SFT, in the cycles SFT leaves idle
                lower_thread_priority()
                trainer.precompile(groups)
        except Exception as err:  # noqa: BLE001 - the first step compiles (and fails) instead
            log.warning("compiling the RL step ahead failed (%r); its first step compiles", err)

    # Not a daemon: an interrupted run's exit waits for the compile instead of finalizing
    # the interpreter under a thread inside XLA (which aborts the process).
    thread = threading.Thread(target=run, name="agentax-rl-precompile")
    thread.start()
    return thread
