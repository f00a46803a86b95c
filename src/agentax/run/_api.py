"""The library entry points: `train`, `sft` and `evaluate` (what `agentax train | sft | eval`
call), their `RunResult`, and `as_config` (a config from what a caller has)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentax.config import ConfigError, replace
from agentax.run._config import RunConfig, apply_overrides, load_config
from agentax.run._hooks import Hook
from agentax.trace import CONFIG_FILENAME

__all__ = ["RunResult", "as_config", "evaluate", "sft", "train"]

# A run that fails with one of these before it logged or saved anything leaves no directory.
_FAILED_START = (ConfigError, FileNotFoundError, FileExistsError, NotADirectoryError,
                 IsADirectoryError, PermissionError, ValueError, OSError)

ConfigLike = RunConfig | Mapping[str, Any] | str | os.PathLike


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run left behind; the full record is RUN_DIR/summary.json (`summary`)."""

    run_dir: Path
    steps: int = 0
    """RL steps in metrics.jsonl (across resumed segments)."""
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The last RL step's row of metrics.jsonl (empty without RL steps)."""
    eval_before: Mapping[str, Any] | None = None
    """The evaluation before RL (`train`), or None."""
    eval_after: Mapping[str, Any] | None = None
    """The evaluation after training (`train`, `sft`), or the evaluation (`evaluate`)."""
    sft: Mapping[str, Any] | None = None
    """The warm start's last `sft/loss` and `sft/accuracy`, when it ran."""
    stopped_early: Mapping[str, Any] | None = None
    """`{"step", "reason"}` when RL ended before `run.steps` (`pipeline.stop_success`)."""
    summary: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def as_config(config: ConfigLike | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """A validated, resolved `RunConfig` from a `RunConfig`, a mapping of sections
    (`{"run": {"steps": 5}}`), a YAML file, a shipped recipe name, or a run directory (its
    config.yaml); then `overrides` (`"section.field=value"`, as on the command line).
    None: the defaults (the embedded CPU demo)."""
    from agentax.recipes import RECIPES, recipe_path
    from agentax.run._build import resolve_config

    if isinstance(config, RunConfig):
        cfg = load_config(None, overrides, base=config) if overrides else config
    elif isinstance(config, Mapping):
        cfg = apply_overrides(RunConfig(), config, "config mapping")
        cfg = load_config(None, overrides, base=cfg) if overrides else cfg
    elif config is None:
        cfg = load_config(None, overrides)
    else:
        path = os.fspath(config)
        if os.path.isdir(path):
            cfg = load_config(os.path.join(path, CONFIG_FILENAME), overrides,
                              relative_to_file=False)
        elif os.path.isfile(path):
            cfg = load_config(path, overrides)
        elif path in RECIPES:
            cfg = load_config(recipe_path(path), overrides)
        else:
            raise ConfigError(f"{path!r} is neither a YAML file, a recipe nor a run directory; "
                              f"recipes: {', '.join(RECIPES)}")
    return resolve_config(cfg)


def _result(run_dir: Path, summary: Mapping[str, Any], *, eval_key: str = "eval_after"
            ) -> RunResult:
    from agentax.run._reporter import phase_rows

    rl = phase_rows(run_dir).get("rl") or [{}]
    return RunResult(run_dir=run_dir, steps=int(summary.get("rl_steps", 0)), metrics=rl[-1],
                     eval_before=summary.get("eval_before"), eval_after=summary.get(eval_key),
                     sft=summary.get("sft"), stopped_early=summary.get("stopped_early"),
                     summary=summary)


def _fresh_run_dir(cfg: RunConfig, command: str) -> Path:
    """runs_dir/<run.name or timestamp-command>, named by process 0 for every process."""
    from agentax.run._rundir import make_run_dir
    from agentax.train import broadcast_from_main, is_main_process

    return Path(broadcast_from_main(str(make_run_dir(cfg, command)) if is_main_process()
                                    else None))


def train(config: ConfigLike | None = None, run_dir: str | os.PathLike | None = None, *,
          overrides: Sequence[str] = (), hooks: Sequence[Hook] = (), resume: bool | None = None,
          quiet: bool = False) -> RunResult:
    """Trains as `agentax train` does: (SFT warm start,) evaluate, RL, evaluate, doctor.

    Args:
      config: a `RunConfig`, a mapping of sections, a YAML file, a recipe name, or a run
        directory to resume (see `as_config`); None: the embedded CPU demo.
      run_dir: where the run writes; None: a fresh `run.runs_dir/<run.name or timestamp>`
        (removed again if the run fails on bad input before it logged anything); a run
        directory given as `config` is resumed in place.
      overrides: `section.field=value` strings applied over `config`.
      hooks: `Hook(fn, every=N)`: `fn(StepInfo)` after every N-th RL step, after the run's
        own hooks (transcripts, metrics, console, checkpoint, eval).
      resume: continue `run_dir` from its newest checkpoint (default: when `config` is a run
        directory).
      quiet: no console output but warnings and resume lines.

    A signal (Ctrl-C, SIGTERM) stops the run between two steps with a checkpoint and raises
    `Interrupted`; `train(run_dir)` continues it.
    """
    from agentax.run._rundir import is_run_dir, remove_failed_start
    from agentax.run._runner import run_train
    from agentax.run._signals import Interrupted
    from agentax.train import is_main_process

    given_dir = not isinstance(config, (RunConfig, Mapping)) and config is not None \
        and is_run_dir(config)
    cfg = as_config(config, overrides)
    if resume is None:
        resume = given_dir
    if run_dir is None and given_dir:
        run_dir = Path(os.fspath(config))
    fresh = run_dir is None
    if fresh:
        if given_dir:  # a finished run's config starts a new run beside it
            cfg = replace(cfg, run=replace(cfg.run, name=""))
        run_dir = _fresh_run_dir(cfg, "train")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        summary = run_train(cfg, run_dir, resume=resume, quiet=quiet, hooks=hooks)
    except _FAILED_START:  # bad input or no disk space: nothing worth keeping
        if fresh and is_main_process():
            remove_failed_start(run_dir)
        raise
    except Interrupted as e:
        if e.message:
            raise
        raise Interrupted(e.signum, f"{e} before the RL loop (nothing new saved); "
                          f"`agentax train {run_dir}` continues from its newest checkpoint, "
                          "or starts over if it has none") from None
    return _result(run_dir, summary)


def sft(config: ConfigLike | None = None, run_dir: str | os.PathLike | None = None, *,
        overrides: Sequence[str] = (), quiet: bool = False) -> RunResult:
    """The SFT warm start alone, as `agentax sft`: trains `sft.steps`, saves the trainer to
    RUN_DIR/checkpoints and evaluates it (`RunResult.eval_after`)."""
    from agentax.run._runner import run_sft

    cfg = as_config(config, overrides)
    with _fresh_or_given(cfg, "sft", run_dir) as path:
        return _result(path, run_sft(cfg, path, quiet=quiet), eval_key="eval")


def evaluate(config: ConfigLike | None = None, run_dir: str | os.PathLike | None = None, *,
             overrides: Sequence[str] = (), model=None, quiet: bool = False) -> RunResult:
    """Success rate and reward on the held-out tasks, as `agentax eval` (in
    `RunResult.eval_after`). `config` as for `train`; given a run directory, its trained
    policy is evaluated (in a new run directory). `model`: a `Transformer` to evaluate instead
    of the config's."""
    from agentax.run._build import load_run_model
    from agentax.run._rundir import is_run_dir
    from agentax.run._runner import run_eval

    cfg = as_config(config, overrides)
    if model is None and not isinstance(config, (RunConfig, Mapping)) and config is not None \
            and is_run_dir(config):
        model = load_run_model(Path(os.fspath(config)), cfg)
        cfg = replace(cfg, run=replace(cfg.run, name=""))
    with _fresh_or_given(cfg, "eval", run_dir) as path:
        return _result(path, run_eval(cfg, path, model=model, quiet=quiet), eval_key="eval")


class _fresh_or_given:
    """The run directory given (created if missing), or a fresh one that a failed start
    removes again."""

    def __init__(self, cfg: RunConfig, command: str, run_dir):
        from agentax.run._rundir import make_run_dir

        self.fresh = run_dir is None
        self.path = make_run_dir(cfg, command) if self.fresh else Path(run_dir)
        self.path.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, kind, error, tb) -> bool:
        from agentax.run._rundir import remove_failed_start

        if self.fresh and error is not None and isinstance(error, _FAILED_START):
            remove_failed_start(self.path)
        return False
