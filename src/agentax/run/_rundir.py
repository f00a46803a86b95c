"""Run directories: one folder per run with its resolved config, metrics, trace, checkpoints.

What a resume relies on (docs/reliability.md): every checkpoints/step_N is complete (written
under a temporary name, then renamed); its meta.json records the run's position and the
length metrics.jsonl had, so a resume cuts the log back to it; config.yaml is replaced
atomically, and on a resume only once the checkpoint has been restored.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentax.run._config import RunConfig, dump_config, load_config
from agentax.run._console import warn_line
from agentax.config import ConfigError
from agentax.trace import CONFIG_FILENAME, METRICS_FILENAME

__all__ = ["CHECKPOINT_DIR", "DOCTOR_REPORT", "RunCheckpointer", "checkpoint_kind", "cut_metrics",
           "cut_process_metrics", "is_run_dir", "make_run_dir", "restore_newest", "resume_hint",
           "run_config", "write_config"]

CHECKPOINT_DIR = "checkpoints"
DOCTOR_REPORT = "doctor.txt"
"""RUN_DIR/doctor.txt: the doctor's full report at the end of `agentax train`."""


def is_run_dir(path: str | os.PathLike) -> bool:
    """A directory holding a config.yaml written by an earlier run."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG_FILENAME))


def make_run_dir(cfg: RunConfig, command: str) -> Path:
    """Creates runs_dir/<name or timestamp-command> (a fresh one: never reuses a folder)."""
    name = cfg.run.name or time.strftime("%Y%m%d-%H%M%S") + f"-{command}"
    path = Path(cfg.run.runs_dir) / name
    base, k = path, 1
    while path.exists() and any(path.iterdir()):
        if cfg.run.name:
            raise ConfigError(f"run directory {path} already exists; resume it with "
                              f"`agentax train {path}` or pick another run.name")
        k += 1
        path = Path(f"{base}-{k}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_config(run_dir: Path, cfg: RunConfig) -> Path:
    """Writes RUN_DIR/config.yaml atomically (a kill leaves the old file or the new one)."""
    path = run_dir / CONFIG_FILENAME
    tmp = run_dir / (CONFIG_FILENAME + ".tmp")
    try:
        tmp.write_text(dump_config(cfg), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}"
                      + ("; free disk space there (or move run.runs_dir)"
                         if e.errno in (errno.ENOSPC, errno.EDQUOT) else "")) from None
    return path


def remove_failed_start(run_dir: Path) -> bool:
    """Removes a fresh run directory whose run failed before it logged or saved anything (a
    failed start leaves nothing to resume); True if it did."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILENAME
    if (run_dir / CHECKPOINT_DIR).exists() or (metrics.exists() and metrics.stat().st_size):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return not run_dir.exists()


def run_config(run_dir: str | os.PathLike, overrides=()) -> RunConfig:
    """The config a run directory was written with, plus command-line overrides (its relative
    paths stay relative to the current directory, as they were when the run started)."""
    return load_config(Path(run_dir) / CONFIG_FILENAME, overrides, relative_to_file=False)


# ----------------------------------------------------------------------------- checkpoints


class RunCheckpointer:
    """Saves the RL trainer with the run's position, at most once per RL step.

    The checkpoint's meta.json gets a "run" record: `rl_step` (the pipeline's step, which the
    metrics rows use), `next_group` (the task position) and `metrics_bytes` (the length of
    metrics.jsonl when it was written: a resume cuts the file back to it).
    """

    def __init__(self, run_dir: Path, saved_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.saved_step = saved_step
        """RL step of the newest checkpoint this run wrote or resumed from."""

    def save(self, trainer, *, rl_step: int, next_group: int) -> Path | None:
        """Writes checkpoints/step_<rl_step>, unless this step is already saved."""
        if rl_step == self.saved_step:
            return None
        metrics = self.run_dir / METRICS_FILENAME
        record = {"rl_step": int(rl_step), "next_group": int(next_group),
                  "metrics_bytes": metrics.stat().st_size if metrics.exists() else 0}
        path = trainer.save_checkpoint(self.run_dir / CHECKPOINT_DIR, rl_step, run=record)
        self.saved_step = rl_step
        return path


def checkpoint_kind(run_dir: str | os.PathLike) -> str | None:
    """'rl' or 'sft' for the newest readable checkpoint of a run; None when it has none.

    When checkpoints exist but none has a readable meta.json, 'rl' (a resume then reports
    them as damaged).
    """
    from agentax.train import DamagedCheckpointError, checkpoint_steps, read_checkpoint_meta

    ckpt = Path(run_dir) / CHECKPOINT_DIR
    steps = checkpoint_steps(ckpt)
    for step in reversed(steps):
        try:
            return read_checkpoint_meta(ckpt / f"step_{step}")["kind"]
        except DamagedCheckpointError:
            continue
    return "rl" if steps else None


def restore_newest(run_dir: Path, trainer, warn: Callable[[str], None] = warn_line
                   ) -> dict[str, Any]:
    """Restores the newest checkpoint of `run_dir` that can be read into `trainer`.

    A checkpoint that cannot be read is reported (a `warn` line) and the next older one tried.

    Returns:
      The checkpoint's "run" record ({"rl_step", "next_group", "metrics_bytes"}; for
      checkpoints older than that record, {"rl_step": trainer step}).
    Raises:
      DamagedCheckpointError: none of them can be read.
      ValueError: the checkpoint was written by another model/trainer config.
    """
    from agentax.train import DamagedCheckpointError, checkpoint_steps, read_checkpoint_meta

    ckpt = run_dir / CHECKPOINT_DIR
    damaged: list[str] = []
    for step in reversed(checkpoint_steps(ckpt)):
        path = ckpt / f"step_{step}"
        try:
            meta = read_checkpoint_meta(path)
            if meta["kind"] != "rl":
                raise ConfigError(f"{run_dir} holds an SFT checkpoint ({path}); start RL from it "
                                  f"with init.from_run={run_dir} in a new run")
            trainer.restore_checkpoint(ckpt, step)
        except DamagedCheckpointError as e:
            warn(f"{e}; trying the previous checkpoint")
            damaged.append(str(path))
            continue
        record = dict(meta.get("run") or {"rl_step": trainer.step_count})
        record["path"] = str(path)
        return record
    if damaged:
        raise DamagedCheckpointError(
            f"no checkpoint of {run_dir} can be read ({', '.join(damaged)}); delete "
            f"{ckpt} to start the run over")
    raise FileNotFoundError(f"{run_dir} has no checkpoint")


def cut_metrics(run_dir: Path, record: dict[str, Any] | None) -> int:
    """Cuts RUN_DIR/metrics.jsonl back to where it stood at the checkpoint `record`.

    Rows written after the checkpoint belong to work the resumed run redoes; cutting them
    keeps each step's row once. Greedy evaluations of steps up to the checkpoint (run
    concurrently, so possibly logged after it) are kept. With `record` None (no checkpoint:
    the run starts over) the file is emptied. Returns the number of rows removed.
    """
    path = run_dir / METRICS_FILENAME
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep_bytes = 0 if record is None else int(record.get("metrics_bytes", len(data)))
    head, tail = data[:keep_bytes], data[keep_bytes:]
    if not tail:
        return 0
    step = -1 if record is None else int(record.get("rl_step", -1))
    kept, removed = [], 0
    for line in tail.splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a row cut short by a kill
            removed += 1
            continue
        if row.get("phase") == "eval_mid" and row.get("step", step + 1) <= step:
            kept.append(line + b"\n")
        else:
            removed += 1
    # In place (the metrics logger may already hold the file open for appending).
    with open(path, "r+b") as f:
        f.truncate(len(head))
        f.seek(len(head))
        f.write(b"".join(kept))
    return removed


def cut_process_metrics(out_dir: Path, record: dict[str, Any]) -> int:
    """Cuts a process's own metrics.jsonl (RUN_DIR/process_<i>, i > 0) back to the checkpoint
    `record`: its rows of RL steps (and mid-run evaluations) after the checkpoint's step go,
    as do rows cut short by a kill, so a resumed run logs each step once there too. Returns
    the number of rows removed."""
    path = out_dir / METRICS_FILENAME
    if not path.exists():
        return 0
    step = int(record.get("rl_step", -1))
    kept, removed = [], 0
    for line in path.read_bytes().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            removed += 1
            continue
        if row.get("phase") in ("rl", "eval_mid") and int(row.get("step", -1)) > step:
            removed += 1
        else:
            kept.append(line + b"\n")
    if removed:
        with open(path, "r+b") as f:  # in place: the logger may hold it open for appending
            f.truncate(0)
            f.write(b"".join(kept))
    return removed


def resume_hint(run_dir: Path) -> str:
    """Where a stopped run resumes from (its newest complete checkpoint) and the command."""
    ckpt = run_dir / CHECKPOINT_DIR
    steps = sorted(int(p.name[5:]) for p in ckpt.glob("step_*")
                   if p.name[5:].isdigit() and (p / "meta.json").is_file())
    if steps:
        return f"Resume from {ckpt / f'step_{steps[-1]}'}: agentax train {run_dir} (the same flags)"
    return f"No checkpoint yet: agentax train {run_dir} (the same flags) starts it over"
