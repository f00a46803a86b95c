"""What `train`, `agentax sft` and `agentax eval` do: warm start, evaluate, RL, evaluate.

Nothing here knows the task: the environment, agent, tasks and demonstrations come from the
config (`build_suite_for`), and the numbers shown are the per-episode metrics every episode
reports (`episode_metrics`), gathered through the pipeline's episode hook.

Every command writes one run directory (config.yaml, metrics.jsonl, the Perfetto trace,
checkpoints/, transcripts.jsonl, curves.png, doctor.txt, summary.json). `train` resumes from a
run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentax import _aio as aio
from agentax.config import replace
from agentax.run._build import build_engine, build_mesh, build_model, build_suite_for, build_tokenizer
from agentax.run._config import RunConfig
from agentax.run._evaluate import evaluate_config
from agentax.run._hooks import Hook
from agentax.run._reporter import Reporter, phase_rows, process_count, report_eval, say_always
from agentax.run._rl import PRECOMPILE_MAX_KERNELS, RLPhase, precompile_rl
from agentax.run._scale import RayLayout
from agentax.run._rundir import (
    CHECKPOINT_DIR,
    DOCTOR_REPORT,
    RunCheckpointer,
    checkpoint_kind,
    cut_metrics,
    cut_process_metrics,
    restore_newest,
    resume_hint,
    write_config,
)
from agentax.run._sft import SFTPhase, sft_record
from agentax.run._signals import Interrupted, StopGuard
from agentax.train import check_space, checkpoint_bytes, is_main_process

__all__ = ["run_eval", "run_sft", "run_train"]


def run_train(cfg: RunConfig, run_dir: Path, *, resume: bool = False, quiet: bool = False,
              hooks: Sequence[Hook] = ()) -> dict:
    """`agentax train`: (SFT warm start,) evaluate, RL through the pipeline, evaluate, doctor.

    Returns the summary (also written to RUN_DIR/summary.json).
    """
    try:
        with StopGuard() as guard:
            try:
                return _run_train(cfg, run_dir, resume, quiet, guard, hooks)
            except Interrupted:
                guard.acknowledge()
                raise
    finally:
        gc.unfreeze()  # what the run built may be collected again (run_train called in-process)


def _warm_start(cfg: RunConfig, rep: Reporter, trainer, model, tokenizer, suite, mesh,
                guard: StopGuard, resume: bool, summary: dict):
    """The SFT phase before RL; returns (SFT weights, the engine if one was built)."""
    engine = compiling = None
    # (With engine replicas in Ray actors there is no engine here to compile beside SFT.)
    if process_count() == 1 and not cfg.scale.engine_replicas:
        # Kernels depend on shapes, not weights: the engine's step thread and a thread of ours
        # compile the engine's and the RL trainer's while SFT trains (its steps leave most of
        # a second core idle); then both get the SFT weights. One trainer state at a time: the
        # RL trainer's is freed while SFT trains (it compiles from shapes), the SFT trainer's
        # as its weights are exported. (Several processes: SFT's collectives and the RL
        # kernels' compile-ahead would interleave differently on each; SFT first.)
        trainer.release()
        # Ahead only when that is a few kernels: a real model's engine (64 slots at 32k
        # tokens: 261 shapes, most never met) compiles lazily instead, each shape once, into
        # the persistent compilation cache.
        ahead = len(cfg.engine.kernel_shapes()) <= PRECOMPILE_MAX_KERNELS
        engine = build_engine(replace(cfg, engine=replace(cfg.engine, precompile=ahead)),
                              model, tokenizer)
        compiling = precompile_rl(cfg, trainer, after=engine.wait_compiled)
    phase = SFTPhase(cfg, suite, tokenizer, rep, mesh=mesh, guard=guard, resume=resume)
    model = phase.run(model).export_model(release=True)
    if engine is not None:
        engine.update_weights(model, 0)
    if compiling is not None:
        compiling.join()
    gc.freeze()
    trainer.load_weights(model)
    summary["sft"] = phase.last
    rep.say(f"sft: {cfg.sft.steps} steps in {rep.timings['sft_s']:.1f} s, "
            f"loss {phase.last.get('sft/loss', float('nan')):.3f}")
    return model, engine


def _run_train(cfg: RunConfig, run_dir: Path, resume: bool, quiet: bool, guard: StopGuard,
               hooks: Sequence[Hook]) -> dict:
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
        cut_metrics(run_dir, sft_record(run_dir) if cfg.sft.steps else None)
    guard.check()
    if process_count() > 1:  # the line a survivor prints when a peer dies (`_liveness.py`)
        from agentax.train import set_resume_hint

        set_resume_hint(lambda: resume_hint(run_dir))
    rep = Reporter(cfg, run_dir, quiet=quiet)
    try:
        rep.say(f"[bold]agentax train[/bold] -> {run_dir}")
        mesh = build_mesh(cfg)
        tokenizer = build_tokenizer(cfg)
        suite = build_suite_for(cfg)
        guard.check()
        position: dict[str, Any] = {}
        summary: dict[str, Any] = {"run_dir": str(run_dir), "task": suite.name}
        engine = layout = None
        try:
            if cfg.scale.enabled:
                # Before the model: a request the cluster cannot place fails now, and the
                # actors start (environments built, engines compiled) while the run loads.
                layout = RayLayout(cfg)
                for key, (asked, free) in layout.busy.items():
                    rep.warn(f"the scale section asks Ray for {key}={asked:g}, but only "
                             f"{free:g} is free now: its actors wait for the rest (up to "
                             f"scale.start_timeout_s={cfg.scale.start_timeout_s:g} s)")
                if layout.pool is not None:
                    suite = dataclasses.replace(suite, make_env=layout.pool.factory)
                guard.check()
            model = build_model(cfg)
            guard.check()
            rep.timings["startup_s"] = rep.elapsed()
            gc.freeze()
            trainer = RLTrainer(model, cfg.trainer, mesh=mesh)
            # Before hours of SFT and RL: is there room for the first checkpoint at all?
            check_space(run_dir / CHECKPOINT_DIR, checkpoint_bytes(trainer))
            if found is None and cfg.sft.steps:
                model, engine = _warm_start(cfg, rep, trainer, model, tokenizer, suite, mesh,
                                            guard, resume, summary)
            guard.check()
            if found is not None:
                position = restore_newest(run_dir, trainer, warn=rep.warn)
                cut = (cut_metrics(run_dir, position) if main
                       else cut_process_metrics(rep.out_dir, position))
                if main:
                    write_config(run_dir, cfg)
                model = trainer.export_model()
                # Said even with -q (the console is quiet): a resume must never pass unseen.
                say_always(rep, f"resumed from step {position['rl_step']} ({position['path']})"
                           + (f"; {cut} later metrics rows cut" if cut else ""))
                guard.check()
            start_step = int(position.get("rl_step", trainer.step_count))
            if engine is None and layout is not None and layout.router is not None:
                engine = layout.engine(trainer, start_step)
            if engine is None:
                engine = build_engine(cfg, model, tokenizer, version=start_step)
            summary.update(RLPhase(
                cfg, rep, trainer, engine, tokenizer, suite, start_step,
                int(position.get("next_group", 0)), guard,
                RunCheckpointer(run_dir, start_step if position else None), hooks).run())
        finally:
            if layout is not None:
                try:
                    summary["scale"] = layout.stats()
                except Exception as e:  # noqa: BLE001 - figures only: the shutdown matters
                    summary["scale"] = {"error": f"{type(e).__name__}: {e}"}
                layout.shutdown()  # the router (if it is the engine) with the rest
                if cfg.scale.engine_replicas:  # the engine was the router: shut down
                    engine = None
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
    _finish(cfg, run_dir, rep, summary)
    return summary


def _finish(cfg: RunConfig, run_dir: Path, rep: Reporter, summary: dict) -> None:
    """The end of a run: curves.png, the doctor's report, summary.json, the last line."""
    if cfg.tracing.plots:
        from agentax.run._plots import plot_curves

        # From metrics.jsonl: every segment of a resumed run, not only this process's rows.
        rows = [r for rows_of in phase_rows(run_dir).values() for r in rows_of]
        rows.sort(key=lambda r: r.get("time", 0.0))
        summary["plot"] = str(plot_curves(rows or rep.history, run_dir / "curves.png"))
    if cfg.tracing.enabled and cfg.tracing.doctor and summary.get("rl_steps", 0):
        summary["doctor"] = _doctor_summary(run_dir, rep)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    rep.say(f"done in {summary['wall_s']:.1f} s; run directory {run_dir}")


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
        phase = SFTPhase(cfg, suite, tokenizer, rep, mesh=build_mesh(cfg), save=True)
        trainer = phase.run(model)
        engine = build_engine(cfg, trainer.export_model(release=True), tokenizer)
        try:
            results = aio.run(evaluate_config(cfg, engine, tokenizer, suite))
        finally:
            engine.shutdown()
        with contextlib.closing(rep.transcripts(tokenizer)) as transcripts:
            summary = {"run_dir": str(run_dir), "sft": phase.last,
                       "eval": report_eval(rep, cfg.sft.steps, "after_sft", results,
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
            results = aio.run(evaluate_config(cfg, engine, tokenizer, suite))
        finally:
            engine.shutdown()
        with contextlib.closing(rep.transcripts(tokenizer)) as transcripts:
            summary = {"run_dir": str(run_dir),
                       "eval": report_eval(rep, 0, "", results, transcripts),
                       "wall_s": rep.elapsed()}
    finally:
        rep.close()
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
