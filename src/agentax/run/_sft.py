"""The SFT warm start as one phase object (`SFTPhase`), used by `train` and `agentax sft`."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

from agentax.config import replace
from agentax.run._build import TaskSuite
from agentax.run._config import RunConfig
from agentax.run._reporter import Reporter, say_always
from agentax.run._rundir import CHECKPOINT_DIR
from agentax.run._signals import Interrupted, StopGuard, interrupted_by
from agentax.train import is_main_process
from agentax.trace import names

__all__ = ["SFT_CHECKPOINTS", "SFTPhase", "demonstrations", "sft_record", "sft_trainer_config"]


SFT_CHECKPOINTS = "sft"
"""RUN_DIR/checkpoints/sft: the SFT trainer of `agentax train` (the newest kept)."""


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


def sft_record(run_dir: Path) -> dict | None:
    """The run record of the newest readable SFT checkpoint of `run_dir`, or None."""
    from agentax.train import DamagedCheckpointError, checkpoint_steps, read_checkpoint_meta

    ckpt = run_dir / CHECKPOINT_DIR / SFT_CHECKPOINTS
    for step in reversed(checkpoint_steps(ckpt)):
        try:
            return dict(read_checkpoint_meta(ckpt / f"step_{step}").get("run") or {})
        except DamagedCheckpointError:
            continue
    return None


class SFTPhase:
    """SFT on the task's demonstrations (`sft.*`), on `mesh` (the RL trainer's).

    `run(model)` trains `sft.steps` steps and returns the SFT trainer; `last` holds the last
    logged metrics (`sft/loss`, `sft/accuracy`). Rows go to metrics.jsonl with phase `sft`,
    every `sft.steps // 10` steps and at the last.

    With `guard` (`train`), the phase is resumable: the trainer is saved to
    RUN_DIR/checkpoints/sft at most every `sft.checkpoint_every_s`, at the end, and when a
    signal stops it between two steps; `resume` continues from the newest such checkpoint.
    `save` (`agentax sft`) saves the final trainer to RUN_DIR/checkpoints.
    """

    def __init__(self, cfg: RunConfig, suite: TaskSuite, tokenizer, rep: Reporter, *,
                 mesh=None, guard: StopGuard | None = None, resume: bool = False,
                 save: bool = False):
        self.cfg, self.suite, self.tokenizer, self.rep = cfg, suite, tokenizer, rep
        self.mesh, self.guard, self.resume, self.save = mesh, guard, resume, save
        self.ckpt_dir = rep.run_dir / CHECKPOINT_DIR / SFT_CHECKPOINTS
        self.last: dict[str, Any] = {}
        self._saved: int | None = None
        self.trainer = None

    def _new_trainer(self, model):
        from agentax.train import SFTTrainer

        return SFTTrainer(model, sft_trainer_config(self.cfg), mesh=self.mesh)

    def _restore(self, model) -> int:
        """The step to start from: that of the newest SFT checkpoint on a resume, else 0."""
        from agentax.train import DamagedCheckpointError, read_checkpoint_meta

        if self.guard is None or not self.resume or not self.ckpt_dir.is_dir():
            return 0
        try:
            step = self.trainer.restore_checkpoint(self.ckpt_dir)
            record = read_checkpoint_meta(self.ckpt_dir / f"step_{step}").get("run") or {}
            start, self.last = int(record.get("sft_step", step)), dict(record.get("last") or {})
            say_always(self.rep, f"resumed SFT from step {start} "
                                 f"({self.ckpt_dir / f'step_{step}'})")
            return start
        except (DamagedCheckpointError, FileNotFoundError) as e:
            self.rep.warn(f"{e}; SFT starts over")
            self.trainer = self._new_trainer(model)
            return 0

    def checkpoint(self, i: int) -> None:
        """Saves the SFT trainer at step `i` (resumable phases only), keeping only the newest."""
        if self.guard is None or self._saved == i:
            return
        metrics = self.rep.run_dir / "metrics.jsonl"
        with self.guard.saving():
            self.trainer.sync_counters()
            self.trainer.save_checkpoint(self.ckpt_dir, i, run={
                "sft_step": i, "last": self.last, "rl_step": -1,
                "metrics_bytes": metrics.stat().st_size if metrics.exists() else 0})
        for old in self.ckpt_dir.glob("step_*") if is_main_process() else ():  # only the newest
            if old.name != f"step_{i}":  # is ever resumed from
                shutil.rmtree(old, ignore_errors=True)
        self._saved = i

    def run(self, model):
        """Trains; returns the SFT trainer (its weights: `trainer.export_model()`)."""
        from agentax.recipes import render_examples

        cfg, rep, guard = self.cfg, self.rep, self.guard
        t0 = time.perf_counter()
        examples = render_examples(self.tokenizer, demonstrations(cfg, self.suite),
                                   tools=list(self.suite.tools) or None)
        rep.timings["sft_render_s"] = time.perf_counter() - t0
        self.trainer = self._new_trainer(model)
        start = self._restore(model)
        self._saved = start if start else None
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
                            self.checkpoint(i)
                            t_saved = time.perf_counter()
                        metrics = self.trainer.step(self.trainer.take(
                            examples, batch_size=cfg.sft.batch_size,
                            batch_tokens=cfg.sft.batch_tokens))
                        if (i + 1) % every == 0 or i + 1 == cfg.sft.steps:
                            self.last = {f"sft/{k}": v for k, v in metrics.to_dict().items()
                                         if k in ("loss", "accuracy")}
                            rep.log(i + 1, {"phase": "sft", **self.last})
                            if view is not None:
                                view.update(i, {k.split("/")[1]: v for k, v in self.last.items()})
                    i = cfg.sft.steps
                    self.checkpoint(i)
            except Interrupted as e:
                if view is not None:
                    view.close()
                if guard is None or e.message:
                    raise
                self.checkpoint(i)
                raise Interrupted(e.signum, f"stopped at SFT step {i} ({interrupted_by(e.signum)}); "
                                  f"checkpoint {self.ckpt_dir}/step_{i} is complete; "
                                  f"continue with `agentax train {rep.run_dir}`") from None
            if view is not None:
                view.close()
            self.trainer.sync_counters()
        rep.timings["sft_s"] = time.perf_counter() - t0
        if self.save:
            self.trainer.save_checkpoint(rep.run_dir / CHECKPOINT_DIR)
        return self.trainer
