"""Run directories: one folder per run with its resolved config, metrics, trace, checkpoints."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from agentax.cli._config import RunConfig, dump_config, load_config
from agentax.config import ConfigError
from agentax.trace import CONFIG_FILENAME

__all__ = ["CHECKPOINT_DIR", "STATE_FILENAME", "is_run_dir", "make_run_dir", "read_state",
           "run_config", "write_config", "write_state"]

CHECKPOINT_DIR = "checkpoints"
STATE_FILENAME = "state.json"


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
    path = run_dir / CONFIG_FILENAME
    path.write_text(dump_config(cfg), encoding="utf-8")
    return path


def run_config(run_dir: str | os.PathLike, overrides=()) -> RunConfig:
    """The config a run directory was written with, plus command-line overrides."""
    return load_config(Path(run_dir) / CONFIG_FILENAME, overrides)


def write_state(run_dir: Path, **state: Any) -> None:
    """Progress counters next to the checkpoints (written atomically)."""
    tmp = run_dir / (STATE_FILENAME + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, run_dir / STATE_FILENAME)


def read_state(run_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(run_dir) / STATE_FILENAME
    return json.loads(path.read_text()) if path.exists() else {}
