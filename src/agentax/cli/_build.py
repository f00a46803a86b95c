"""Builds the live pieces of a run from a `RunConfig`: tokenizer, model, task suite, engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from flax import nnx

from agentax.cli._config import DEMO_MODEL, RunConfig
from agentax.config import ConfigError, replace
from agentax.engine import Engine
from agentax.models import ModelConfig, Transformer, load_pretrained, read_hf_config
from agentax.recipes import TaskSuite, build_suite
from agentax.text import load_tokenizer

__all__ = ["build_engine", "build_model", "build_suite_for", "build_tokenizer",
           "load_run_model", "resolve_config"]

_DTYPE_FIELDS = ("dtype", "param_dtype")


def _arch(cfg: ModelConfig) -> ModelConfig:
    return dataclasses.replace(cfg, dtype="float32", param_dtype="float32")


def resolve_config(cfg: RunConfig) -> RunConfig:
    """Fills in what the run will really use (the architecture of init.model_path / from_run).

    Raises:
      ConfigError: `model` was set although the checkpoint decides the architecture.
    """
    source = None
    if cfg.init.model_path is not None:
        source, where = read_hf_config(cfg.init.model_path), f"init.model_path={cfg.init.model_path}"
        if cfg.init.dtype is not None:
            source = dataclasses.replace(source, dtype=cfg.init.dtype)
    elif cfg.init.from_run is not None:
        from agentax.cli._rundir import run_config

        source, where = run_config(cfg.init.from_run).model, f"init.from_run={cfg.init.from_run}"
    if source is None:
        return cfg
    if cfg.model != DEMO_MODEL and _arch(cfg.model) != _arch(source):
        raise ConfigError(
            f"the model section is set, but {where} decides the architecture: remove the "
            "model section (the resolved config.yaml of the run records it)")
    return replace(cfg, model=source)


def build_tokenizer(cfg: RunConfig) -> Any:
    source = cfg.init.tokenizer_source
    if cfg.init.from_run is not None and not cfg.init.tokenizer:
        from agentax.cli._rundir import run_config

        source = run_config(cfg.init.from_run).init.tokenizer_source
    return load_tokenizer(source)


def latest_checkpoint(run_dir: str | Path) -> tuple[Path, str] | None:
    """(checkpoints dir, trainer kind 'rl' | 'sft') of a run's newest checkpoint, or None."""
    from agentax.cli._rundir import CHECKPOINT_DIR
    from agentax.train import latest_checkpoint_step, read_checkpoint_meta

    ckpt = Path(run_dir) / CHECKPOINT_DIR
    step = latest_checkpoint_step(ckpt)
    if step is None:
        return None
    return ckpt, read_checkpoint_meta(ckpt / f"step_{step}")["kind"]


def load_run_model(run_dir: str | Path, cfg: RunConfig) -> Transformer:
    """The policy saved in `run_dir`'s newest checkpoint (RL or SFT)."""
    from agentax.train import RLTrainer, SFTTrainer

    found = latest_checkpoint(run_dir)
    if found is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint yet ({run_dir}/checkpoints/step_N)")
    ckpt, kind = found
    base = Transformer(cfg.model, rngs=nnx.Rngs(cfg.run.seed))
    trainer_cls = RLTrainer if kind == "rl" else SFTTrainer
    trainer = trainer_cls(base, cfg.trainer)
    trainer.restore_checkpoint(ckpt)
    return trainer.export_model()


def build_model(cfg: RunConfig) -> Transformer:
    """The starting policy: a checkpoint (init.model_path / init.from_run) or a fresh model."""
    if cfg.init.model_path is not None:
        return load_pretrained(cfg.init.model_path, dtype=cfg.init.dtype)
    if cfg.init.from_run is not None:
        from agentax.cli._rundir import run_config

        return load_run_model(cfg.init.from_run, run_config(cfg.init.from_run))
    return Transformer(cfg.model, rngs=nnx.Rngs(cfg.run.seed))


def build_suite_for(cfg: RunConfig) -> TaskSuite:
    e, a = cfg.env, cfg.agent
    return build_suite(
        e.task, seed=cfg.run.seed, num_train_tasks=e.num_train_tasks,
        num_eval_tasks=e.num_eval_tasks, max_digits=e.max_digits, max_steps=e.max_steps,
        train_file=e.train_file, eval_file=e.eval_file, reward=e.reward,
        system_prompt=a.system_prompt, tool_format=a.tool_format, list_tools=a.list_tools)


def build_engine(cfg: RunConfig, model: Transformer, tokenizer: Any, *, version: int = 0) -> Engine:
    return Engine(model, cfg.engine, eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer,
                  policy_version=version)
