"""What `agentax train | sft | eval` do: warm start, evaluate, RL through the pipeline.

Nothing here knows the task: the environment, agent, tasks and demonstrations come from the
config (`build_suite_for`), and the numbers shown are the per-episode metrics every episode
reports (`episode_metrics`), gathered through the pipeline's episode hook.

Every command writes one run directory (config.yaml, metrics.jsonl, the Perfetto trace,
checkpoints/, transcripts.jsonl, curves.png, doctor.txt, summary.json). `train` resumes from a
run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentax import _aio as aio
from agentax._executors import lower_thread_priority
from agentax.cli._build import (
    TaskSuite,
    build_engine,
    build_mesh,
    build_model,
    build_roles,
    build_suite_for,
    build_tokenizer,
)
from agentax.cli._config import RunConfig
from agentax.cli._console import ConsoleView, print_warning
from agentax.cli._evaluate import (
    EvalResult,
    aggregate,
    episode_metrics,
    evaluate,
    task_metric_names,
)
from agentax.cli._rundir import (
    CHECKPOINT_DIR,
    DOCTOR_REPORT,
    RunCheckpointer,
    checkpoint_kind,
    cut_metrics,
    restore_newest,
    write_config,
)
from agentax.cli._signals import Interrupted, StopGuard, hard_exit, interrupted_by
from agentax.cli._transcripts import Transcripts
from agentax.config import replace
from agentax.train import check_space, checkpoint_bytes, is_main_process
from agentax.pipeline import RunFailed
from agentax.records import Group, Trajectory, TrajectoryStatus
from agentax.rollout import Collector
from agentax.trace import MetricsLogger, get_tracer, names

__all__ = ["Reporter", "run_eval", "run_sft", "run_train"]

log = logging.getLogger(__name__)


class Reporter:
    """Console lines, metrics.jsonl, the trace writer and the timing of one run.

    With several processes, process 0 writes the run directory and the console; process i > 0
    keeps its own metrics, trace and transcripts under RUN_DIR/process_<i> (`out_dir`) and
    prints nothing."""

    def __init__(self, cfg: RunConfig, run_dir: Path, *, quiet: bool = False):
        from rich.console import Console

        self.cfg, self.run_dir = cfg, run_dir
        self.main = is_main_process()
        self.out_dir = run_dir if self.main else run_dir / f"process_{_process_index()}"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        # soft_wrap: a long line (a run directory, an error) stays one line in a log file
        self.console = Console(stderr=True, quiet=quiet or not self.main, highlight=False,
                               soft_wrap=True)
        self.metrics = MetricsLogger(self.out_dir, tensorboard=cfg.tracing.tensorboard)
        self.tracer = get_tracer()
        if cfg.tracing.enabled:
            # The process tracer buffers while no file is open: what an earlier run or library
            # call in this process recorded is not this run's (it showed up as phantom episodes).
            self.tracer.take_events()
            self.tracer.start(self.out_dir)
        self.history: list[dict[str, Any]] = []
        self.timings: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, text: str) -> None:
        self.console.print(text)

    def warn(self, text: str) -> None:
        """`warning: text`, like every warning of the CLI (also with -q)."""
        print_warning(self.console, text)

    def transcripts(self, tokenizer, *, segment: int = 0) -> Transcripts:
        """The run's transcript writer (RUN_DIR/transcripts.jsonl; tracing.*transcripts*)."""
        t = self.cfg.tracing
        return Transcripts(self.out_dir, tokenizer, fraction=t.transcripts_fraction,
                           eval_first=t.eval_transcripts, seed=self.cfg.run.seed,
                           segment=segment, max_seq_len=self.cfg.trainer.max_seq_len,
                           warn=self.warn)

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        record = self.metrics.log(step, {**metrics, "wall_s": round(self.elapsed(), 3)})
        self.history.append(record)
        return record

    def view(self, total: int, keys: tuple[str, ...], description: str) -> ConsoleView | None:
        if not self.cfg.tracing.console or self.console.quiet:
            return None
        return ConsoleView(total_steps=total, keys=keys, console=self.console,
                           description=description)

    def close(self) -> None:
        self.metrics.close()
        if self.cfg.tracing.enabled:
            self.tracer.close()


# ----------------------------------------------------------------------------- SFT


def demonstrations(cfg: RunConfig, suite: TaskSuite) -> list:
    if suite.demos is None:
        raise ValueError("sft.steps > 0 but there are no demonstrations: set sft.data=PATH or "
                         "sft.demos='package.module:callable'")
    convs = suite.demos(cfg.sft.num_demos, cfg.run.seed + 1)
    if not convs:
        raise ValueError("the demonstrations are empty (sft.data / sft.demos)")
    return convs


def sft_trainer_config(cfg: RunConfig):
    s = cfg.sft
    return replace(cfg.trainer, learning_rate=s.learning_rate, warmup_steps=s.warmup_steps,
                   decay_steps=max(s.steps - s.warmup_steps, 0) if s.schedule == "cosine" else 0,
                   micro_batch_size=s.micro_batch_size, pack=s.pack, pack_length=s.pack_length,
                   min_seq_bucket=(min(s.pack_length, cfg.trainer.min_seq_bucket) if s.pack
                                   else cfg.trainer.min_seq_bucket),
                   agg_mode="token-mean", policy_loss="ppo", off_policy="none")


SFT_CHECKPOINTS = "sft"
"""RUN_DIR/checkpoints/sft: the SFT trainer of `agentax train` (the newest kept)."""


def warm_start(cfg: RunConfig, model, tokenizer, suite: TaskSuite, rep: Reporter, *,
               save: bool = False, mesh=None, guard: StopGuard | None = None,
               resume: bool = False):
    """SFT on the task's demonstrations (on `mesh`, the RL trainer's); returns (trainer, last
    metrics).

    With `guard` (`agentax train`), SFT is a resumable phase: the trainer is saved to
    RUN_DIR/checkpoints/sft at most every `sft.checkpoint_every_s`, at the end, and when a
    signal stops it between two steps; `resume` continues from the newest such checkpoint.
    """
    from agentax.recipes._render import render_examples
    from agentax.train import DamagedCheckpointError, SFTTrainer, read_checkpoint_meta

    t0 = time.perf_counter()
    examples = render_examples(tokenizer, demonstrations(cfg, suite), tools=list(suite.tools) or None)
    rep.timings["sft_render_s"] = time.perf_counter() - t0
    trainer = SFTTrainer(model, sft_trainer_config(cfg), mesh=mesh)
    ckpt_dir = rep.run_dir / CHECKPOINT_DIR / SFT_CHECKPOINTS
    last: dict[str, Any] = {}
    start = 0
    if guard is not None and resume and ckpt_dir.is_dir():
        try:
            step = trainer.restore_checkpoint(ckpt_dir)
            record = read_checkpoint_meta(ckpt_dir / f"step_{step}").get("run") or {}
            start, last = int(record.get("sft_step", step)), dict(record.get("last") or {})
            _say_always(rep, f"resumed SFT from step {start} ({ckpt_dir / f'step_{step}'})")
        except (DamagedCheckpointError, FileNotFoundError) as e:
            rep.warn(f"{e}; SFT starts over")
            trainer = SFTTrainer(model, sft_trainer_config(cfg), mesh=mesh)
    saved = [start if start else None]

    def checkpoint(i: int) -> None:
        if guard is None or saved[0] == i:
            return
        metrics = rep.run_dir / "metrics.jsonl"
        with guard.saving():
            trainer.sync_counters()
            trainer.save_checkpoint(ckpt_dir, i, run={
                "sft_step": i, "last": last, "rl_step": -1,
                "metrics_bytes": metrics.stat().st_size if metrics.exists() else 0})
        for old in ckpt_dir.glob("step_*") if is_main_process() else ():  # only the newest
            if old.name != f"step_{i}":  # is ever resumed from
                shutil.rmtree(old, ignore_errors=True)
        saved[0] = i

    view = rep.view(cfg.sft.steps, ("loss", "accuracy"), "sft")
    every = max(1, cfg.sft.steps // 10)
    every_s = cfg.sft.checkpoint_every_s
    t0 = t_saved = time.perf_counter()
    i = start
    # One span over the warm start (on the trainer track): the doctor reports the run's SFT
    # time apart from its RL time instead of leaving it out of the wall time unsaid.
    with rep.tracer.span(names.SFT, track=names.TRAINER_TRACK,
                         args={"steps": cfg.sft.steps - start}):
        try:
            with guard.deferring() if guard is not None else contextlib.nullcontext():
                for i in range(start, cfg.sft.steps):
                    if guard is not None:
                        guard.check()  # a signal stops SFT here, between two steps
                    if every_s and time.perf_counter() - t_saved >= every_s and i > start:
                        checkpoint(i)
                        t_saved = time.perf_counter()
                    metrics = trainer.step(trainer.take(examples, batch_size=cfg.sft.batch_size,
                                                        batch_tokens=cfg.sft.batch_tokens))
                    if (i + 1) % every == 0 or i + 1 == cfg.sft.steps:
                        last = {f"sft/{k}": v for k, v in metrics.to_dict().items()
                                if k in ("loss", "accuracy")}
                        rep.log(i + 1, {"phase": "sft", **last})
                        if view is not None:
                            view.update(i, {k.split("/")[1]: v for k, v in last.items()})
                i = cfg.sft.steps
                checkpoint(i)
        except Interrupted as e:
            if view is not None:
                view.close()
            if guard is None or e.message:
                raise
            checkpoint(i)
            raise Interrupted(e.signum, f"stopped at SFT step {i} ({interrupted_by(e.signum)}); "
                              f"checkpoint {ckpt_dir}/step_{i} "
                              f"is complete; continue with `agentax train {rep.run_dir}`") from None
        if view is not None:
            view.close()
        trainer.sync_counters()
    rep.timings["sft_s"] = time.perf_counter() - t0
    if save:
        trainer.save_checkpoint(rep.run_dir / CHECKPOINT_DIR)
    return trainer, last


# ----------------------------------------------------------------------------- evaluation


async def _evaluate(cfg: RunConfig, engine, tokenizer, suite: TaskSuite, *, greedy=None,
                    samples=None, split: bool = True) -> list[EvalResult]:
    e = cfg.eval
    return await evaluate(
        engine, tokenizer, suite, suite.eval_tasks, sampling=cfg.sampling,
        collector_config=cfg.collector, greedy=e.greedy if greedy is None else greedy,
        samples=e.samples if samples is None else samples, max_concurrency=e.max_concurrency,
        seed=cfg.run.seed, keep=cfg.tracing.eval_transcripts, split=split,
        roles=build_roles(e.roles or cfg.env.roles, tokenizer))


def _report_eval(rep: Reporter, step: int, label: str, results: list[EvalResult],
                 transcripts: Transcripts) -> dict:
    """Prints and logs an evaluation (phase `eval_<label>`, or `eval`) and keeps its first
    episodes' transcripts."""
    out: dict[str, float] = {}
    for r in results:
        rep.say(f"[bold]eval {label}[/bold] {r.line()}")
        out.update(r.to_metrics())
    phase = f"eval_{label}" if label else "eval"
    rep.log(step, {"phase": phase, "policy_version": results[0].policy_version
                   if results else 0, **out})
    transcripts.evaluated(phase, step, results)
    return out


# ----------------------------------------------------------------------------- RL


def run_train(cfg: RunConfig, run_dir: Path, *, resume: bool = False, quiet: bool = False) -> dict:
    """`agentax train`: (SFT warm start,) evaluate, RL through the pipeline, evaluate, doctor.

    Returns the summary (also written to RUN_DIR/summary.json).
    """
    try:
        with StopGuard() as guard:
            try:
                return _run_train(cfg, run_dir, resume, quiet, guard)
            except Interrupted:
                guard.acknowledge()
                raise
    finally:
        gc.unfreeze()  # what the run built may be collected again (run_train called in-process)


def _run_train(cfg: RunConfig, run_dir: Path, resume: bool, quiet: bool, guard: StopGuard) -> dict:
    # gc.freeze() after start-up and after SFT: the run's long-lived objects (modules, model,
    # kernels, demonstrations: ~0.4M) leave the cyclic collector's reach until the run ends;
    # otherwise its full collections scan them all and stall the loop (~1 s of a demo run,
    # seen with gc.callbacks).
    from agentax.train import RLTrainer

    # A resume keeps the old config.yaml until its checkpoint is restored (a failed resume
    # with other overrides must not change what the next plain resume reads).
    main = is_main_process()
    found = checkpoint_kind(run_dir) if resume else None
    if found is None and main:
        write_config(run_dir, cfg)
    if resume and found is None and main:
        # Nothing to continue RL from: the run starts over, from its SFT checkpoint if any.
        cut_metrics(run_dir, _sft_record(run_dir) if cfg.sft.steps else None)
    guard.check()
    rep = Reporter(cfg, run_dir, quiet=quiet)
    try:
        rep.say(f"[bold]agentax train[/bold] -> {run_dir}")
        mesh = build_mesh(cfg)
        tokenizer = build_tokenizer(cfg)
        suite = build_suite_for(cfg)
        guard.check()
        model = build_model(cfg)
        guard.check()
        rep.timings["startup_s"] = rep.elapsed()
        gc.freeze()
        position: dict[str, Any] = {}
        summary: dict[str, Any] = {"run_dir": str(run_dir), "task": suite.name}
        engine = None
        try:
            trainer = RLTrainer(model, cfg.trainer, mesh=mesh)
            # Before hours of SFT and RL: is there room for the first checkpoint at all?
            check_space(run_dir / CHECKPOINT_DIR, checkpoint_bytes(trainer))
            if found is None and cfg.sft.steps and _process_count() > 1:
                # Several processes: SFT's collectives and the RL kernels' compile-ahead
                # would interleave differently on each process; SFT first, then the engine.
                sft, last = warm_start(cfg, model, tokenizer, suite, rep, mesh=mesh,
                                       guard=guard, resume=resume)
                model = sft.export_model(release=True)
                gc.freeze()
                trainer.load_weights(model)
                summary["sft"] = last
                rep.say(f"sft: {cfg.sft.steps} steps in {rep.timings['sft_s']:.1f} s, "
                        f"loss {last.get('sft/loss', float('nan')):.3f}")
            elif found is None and cfg.sft.steps:
                # Kernels depend on shapes, not weights: the engine's step thread and a thread
                # of ours compile the engine's and the RL trainer's while SFT trains (its steps
                # leave most of a second core idle); then both get the SFT weights. One trainer
                # state at a time: the RL trainer's is freed while SFT trains (it compiles from
                # shapes), the SFT trainer's as its weights are exported.
                trainer.release()
                # Ahead only when that is a few kernels: a real model's engine (64 slots at
                # 32k tokens: 261 shapes, most never met) compiles lazily instead, each shape
                # once, into the persistent compilation cache.
                ahead = len(cfg.engine.kernel_shapes()) <= PRECOMPILE_MAX_KERNELS
                engine = build_engine(replace(cfg, engine=replace(cfg.engine, precompile=ahead)),
                                      model, tokenizer)
                compiling = _precompile_rl(cfg, trainer, after=engine.wait_compiled)
                sft, last = warm_start(cfg, model, tokenizer, suite, rep, mesh=mesh,
                                       guard=guard, resume=resume)
                model = sft.export_model(release=True)
                engine.update_weights(model, 0)
                compiling.join()
                gc.freeze()
                trainer.load_weights(model)
                summary["sft"] = last
                rep.say(f"sft: {cfg.sft.steps} steps in {rep.timings['sft_s']:.1f} s, "
                        f"loss {last.get('sft/loss', float('nan')):.3f}")
            guard.check()
            if found is not None:
                position = restore_newest(run_dir, trainer, warn=rep.warn)
                cut = cut_metrics(run_dir, position) if main else 0
                if main:
                    write_config(run_dir, cfg)
                model = trainer.export_model()
                # Said even with -q (the console is quiet): a resume must never pass unseen.
                _say_always(rep, f"resumed from step {position['rl_step']} ({position['path']})"
                            + (f"; {cut} later metrics rows cut" if cut else ""))
                guard.check()
            start_step = int(position.get("rl_step", trainer.step_count))
            if engine is None:
                engine = build_engine(cfg, model, tokenizer, version=start_step)
            summary.update(_rl(cfg, rep, trainer, engine, tokenizer, suite, start_step,
                               int(position.get("next_group", 0)), guard,
                               RunCheckpointer(run_dir, start_step if position else None)))
        finally:
            if engine is not None:
                stats = engine.stats()  # start-up cost: compiling, and the first decode call
                rep.timings["engine_compile_s"] = round(stats.compile_s, 2)
                rep.timings["engine_first_step_s"] = stats.first_step_s
                # What the engine computed: prompt tokens prefilled, and those its shared
                # prefix pages saved (a group's samples share their prompt's pages).
                summary["engine"] = {k: getattr(stats, k) for k in (
                    "prefill_tokens", "prefix_hit_tokens", "total_tokens", "evictions",
                    "kv_pages_peak")}
                engine.shutdown()
        summary["wall_s"] = rep.elapsed()
        summary["timings"] = rep.timings
    finally:
        rep.close()
    if not main:  # process 0 writes the run's summary, curves and doctor report
        return summary
    if cfg.tracing.plots:
        from agentax.cli._plots import plot_curves

        # From metrics.jsonl: every segment of a resumed run, not only this process's rows.
        rows = [r for phase_rows in _phase_rows(run_dir).values() for r in phase_rows]
        rows.sort(key=lambda r: r.get("time", 0.0))
        summary["plot"] = str(plot_curves(rows or rep.history, run_dir / "curves.png"))
    if cfg.tracing.enabled and cfg.tracing.doctor and summary.get("rl_steps", 0):
        summary["doctor"] = _doctor_summary(run_dir, rep)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    rep.say(f"done in {summary['wall_s']:.1f} s; run directory {run_dir}")
    return summary


def _process_index() -> int:
    import jax
    return jax.process_index()


def _process_count() -> int:
    import jax
    return jax.process_count()


PRECOMPILE_MAX_KERNELS = 64
"""Engine kernel shapes the CLI compiles ahead during SFT; past this it compiles lazily."""


def _precompile_rl(cfg: RunConfig, trainer, *, after: Callable[[], Any]) -> threading.Thread:
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


def _rl(cfg: RunConfig, rep: Reporter, trainer, engine, tokenizer, suite, start_step: int,
        start_group: int, guard: StopGuard, checkpointer: RunCheckpointer) -> dict:
    from agentax.pipeline import Pipeline

    checkpointer_resumed = checkpointer.saved_step is not None

    def checkpoint() -> None:
        with guard.saving():
            checkpointer.save(trainer, rl_step=pipeline.version, next_group=pipeline.next_group)

    out: dict[str, Any] = {}
    transcripts = rep.transcripts(tokenizer, segment=start_step)
    collector = Collector(engine, tokenizer, suite.make_env, suite.make_agent, cfg.sampling,
                          cfg.collector, reward_fn=suite.reward_fn,
                          roles=build_roles(cfg.env.roles, tokenizer))
    steps_left = max(cfg.run.steps - start_step, 0)
    evals: list[asyncio.Task] = []
    trained = [0]
    sampled: list[dict[str, float]] = []
    views: list[ConsoleView | None] = []

    def on_episode(traj) -> None:
        sampled.append(episode_metrics(traj))

    def on_trained(record, groups) -> None:
        transcripts.trained(record.step, groups,
                            skipped=bool(getattr(record.metrics, "skipped", False)))

    def on_step(record) -> None:
        trained[0] += sum(1 for _ in record.group_ids) * cfg.pipeline.group_size
        # Over every episode finished since the last step (filtered groups included).
        episodes = aggregate(sampled)
        count = len(sampled)
        sampled.clear()
        m = record.metrics
        metrics = {
            "phase": "rl", "policy_version": record.policy_version, **episodes,
            "episodes": count,
            # Over the groups this step trained on (all-equal groups are filtered out).
            "success_trained": record.success_rate, "reward_trained": record.reward_mean,
            "staleness": max(record.staleness, default=0),
            "staleness_mean": float(np.mean(record.staleness)) if record.staleness else 0.0,
            "traj_per_s": trained[0] / max(record.wall_s, 1e-9),
            "train_s": record.train_s, "trainer_wait_s": record.trainer_wait_s,
        }
        if m is not None:
            metrics.update(loss=m.loss, entropy=m.entropy, kl=m.approx_kl,
                           grad_norm=m.grad_norm, skipped=m.skipped)
        rep.log(record.step, metrics)
        if not views:
            keys = ("success", "reward", *task_metric_names(episodes)[:2], "staleness",
                    "traj_per_s")
            views.append(rep.view(cfg.run.steps, keys, "rl"))
        if views[0] is not None:
            views[0].update(record.step - 1, metrics)
        if cfg.run.checkpoint_every and record.step % cfg.run.checkpoint_every == 0:
            checkpoint()
        if cfg.eval.every and record.step % cfg.eval.every == 0 and record.step < cfg.run.steps:
            evals.append(asyncio.get_running_loop().create_task(_mid_eval(record.step)))
        guard.step_logged()

    async def _mid_eval(step: int) -> None:
        # Overlaps training, whose collectives run on the trainer's thread: not split.
        results = await _evaluate(cfg, engine, tokenizer, suite, greedy=True, samples=0, split=False)
        for r in results:
            rep.log(step, {"phase": "eval_mid", "policy_version": r.policy_version,
                           **r.to_metrics()})
        transcripts.evaluated("eval_mid", step, results)

    pipeline = Pipeline(collector, guard.trainer(trainer), engine, list(suite.train_tasks),
                        cfg.pipeline, on_step=on_step, on_episode=on_episode,
                        on_trained=on_trained, start_version=start_step,
                        start_group=start_group)
    saved = f"`agentax train {rep.run_dir}` continues from the newest checkpoint"
    pipeline.on_loop_stuck = lambda error: hard_exit(
        1, f"agentax train: error: {error}; the event loop stayed blocked, so the run exited "
        f"without a new checkpoint; after the fix, {saved}")

    async def main() -> Any:
        guard.enter_loop(asyncio.current_task())
        try:
            return await _main()
        finally:
            await close_shared(cfg.collector.close_timeout_s, rep.warn)
            guard.leave_loop()

    async def _main() -> Any:
        t = time.perf_counter()
        # Once per run: also on a resume from step 0 whose first segment stopped before
        # (or during) it, so the pre-RL figures are never lost.
        if start_step == 0 and not _logged_phase(rep.run_dir, "eval_before"):
            out["eval_before"] = _report_eval(rep, 0, "before", await _evaluate(
                cfg, engine, tokenizer, suite), transcripts)
        rep.timings["eval_before_s"] = time.perf_counter() - t
        t = time.perf_counter()
        # (groups dropped for all-equal rewards: the pipeline's own warning, once a minute)
        result = await pipeline.arun(steps_left)
        rep.timings["rl_s"] = time.perf_counter() - t
        checkpoint()  # before the final evaluation, which a kill may interrupt
        if views and views[0] is not None:
            views[0].close()
        await asyncio.gather(*evals)
        t = time.perf_counter()
        out["eval_after"] = _report_eval(rep, cfg.run.steps, "after", await _evaluate(
            cfg, engine, tokenizer, suite), transcripts)
        rep.timings["eval_after_s"] = time.perf_counter() - t
        return result

    try:
        result = aio.run(main())
    except RunFailed as e:
        # The pipeline finished the step in flight: the trainer's state is that of
        # pipeline.version, so the run resumes where it stopped.
        if views and views[0] is not None:
            views[0].close()
        checkpoint()
        if checkpointer.saved_step is not None:
            e.extend(f"checkpoint {rep.run_dir / CHECKPOINT_DIR}/step_{checkpointer.saved_step} "
                     f"is complete; after the fix, `agentax train {rep.run_dir}` continues "
                     "from it")
        raise
    except BaseException as e:
        if guard.signum is None or not (guard.stopped(e) or isinstance(e, Interrupted)):
            raise
        guard.acknowledge()
        if views and views[0] is not None:
            views[0].close()
        checkpoint()
        raise Interrupted(guard.signum, f"stopped at RL step {pipeline.version} ("
                          f"{interrupted_by(guard.signum)}); checkpoint "
                          f"{rep.run_dir / CHECKPOINT_DIR}/step_{checkpointer.saved_step} is "
                          f"complete; continue with `agentax train {rep.run_dir}`") from None
    finally:
        transcripts.close()
    # The whole run, across resumed segments (metrics.jsonl was cut back to the checkpoint
    # this segment resumed from, so its rows are the run's); `segment` is this process's part.
    rows = _phase_rows(rep.run_dir)
    if "eval_before" not in out and rows.get("eval_before"):
        out["eval_before"] = {k: v for k, v in rows["eval_before"][-1].items()
                              if k not in ("step", "time", "phase", "wall_s", "policy_version")}
    out.update(rl_steps=len(rows.get("rl", [])), trajectories_trained=result.trajectories_trained,
               trajectories_per_s=result.trajectories_per_s,
               trainer_idle_fraction=result.trainer_idle_fraction,
               accounting=result.accounting.summary(),
               segment={"resumed_from_step": start_step if checkpointer_resumed else None,
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


def _sft_record(run_dir: Path) -> dict | None:
    """The run record of the newest readable SFT checkpoint of `run_dir`, or None."""
    from agentax.train import DamagedCheckpointError, checkpoint_steps, read_checkpoint_meta

    ckpt = run_dir / CHECKPOINT_DIR / SFT_CHECKPOINTS
    for step in reversed(checkpoint_steps(ckpt)):
        try:
            return dict(read_checkpoint_meta(ckpt / f"step_{step}").get("run") or {})
        except DamagedCheckpointError:
            continue
    return None


def _phase_rows(run_dir: Path) -> dict[str, list[dict]]:
    """metrics.jsonl's rows by phase (a resume cut it back to its checkpoint first)."""
    out: dict[str, list[dict]] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a line torn by a kill: not a row
                    continue
                if isinstance(row, dict):
                    out.setdefault(str(row.get("phase", "")), []).append(row)
    return out


def _logged_phase(run_dir: Path, phase: str) -> bool:
    """Whether metrics.jsonl has a row of `phase`."""
    return bool(_phase_rows(run_dir).get(phase))


def _say_always(rep: Reporter, text: str) -> None:
    """A line that `-q` does not silence (plain stderr); process 0's only."""
    if not rep.main:
        return
    if rep.console.quiet:
        print(text, file=sys.stderr, flush=True)
    else:
        rep.say(text)


def _doctor_summary(run_dir: Path, rep: Reporter) -> dict:
    """The doctor's verdict on the console and in summary.json; its full report in
    RUN_DIR/doctor.txt (`agentax show --html` shows it)."""
    from agentax.trace import doctor

    try:
        report = doctor.analyze(run_dir)
        (run_dir / DOCTOR_REPORT).write_text(doctor.format_report(report) + "\n",
                                             encoding="utf-8")
    except Exception as e:  # noqa: BLE001 - the doctor must never fail a finished run
        rep.warn(f"the doctor could not analyse the run ({type(e).__name__}: {e})")
        return {"error": str(e)}
    rep.say(f"[bold]doctor[/bold]: bottleneck {report.bottleneck} — {report.verdict}\n"
            f"  suggestion: {report.suggestion}\n  full report: agentax doctor {run_dir}")
    return {"bottleneck": report.bottleneck, "verdict": report.verdict,
            "suggestion": report.suggestion}


# ----------------------------------------------------------------------------- sft / eval


def run_sft(cfg: RunConfig, run_dir: Path, *, quiet: bool = False) -> dict:
    """`agentax sft`: warm start only; saves an SFT checkpoint and evaluates it."""
    write_config(run_dir, cfg)
    rep = Reporter(cfg, run_dir, quiet=quiet)
    try:
        tokenizer, suite = build_tokenizer(cfg), build_suite_for(cfg)
        model = build_model(cfg)
        if not cfg.sft.steps:
            raise ValueError("sft.steps is 0: nothing to train; set sft.steps=N")
        trainer, last = warm_start(cfg, model, tokenizer, suite, rep, save=True,
                                   mesh=build_mesh(cfg))
        engine = build_engine(cfg, trainer.export_model(release=True), tokenizer)
        try:
            results = aio.run(_evaluate(cfg, engine, tokenizer, suite))
        finally:
            engine.shutdown()
        with contextlib.closing(rep.transcripts(tokenizer)) as transcripts:
            summary = {"run_dir": str(run_dir), "sft": last,
                       "eval": _report_eval(rep, cfg.sft.steps, "after_sft", results,
                                            transcripts),
                       "wall_s": rep.elapsed(), "timings": rep.timings}
    finally:
        rep.close()
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def run_eval(cfg: RunConfig, run_dir: Path, *, model=None, quiet: bool = False) -> dict:
    """`agentax eval`: success rate and reward of a policy on the held-out tasks."""
    write_config(run_dir, cfg)
    rep = Reporter(cfg, run_dir, quiet=quiet)
    try:
        tokenizer, suite = build_tokenizer(cfg), build_suite_for(cfg)
        model = model if model is not None else build_model(cfg)
        engine = build_engine(cfg, model, tokenizer)
        try:
            results = aio.run(_evaluate(cfg, engine, tokenizer, suite))
        finally:
            engine.shutdown()
        with contextlib.closing(rep.transcripts(tokenizer)) as transcripts:
            summary = {"run_dir": str(run_dir),
                       "eval": _report_eval(rep, 0, "", results, transcripts),
                       "wall_s": rep.elapsed()}
    finally:
        rep.close()
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
