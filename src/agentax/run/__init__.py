"""agentax.run: what `agentax train | sft | eval` do, as a library.

* `train(config, run_dir=None, *, overrides=(), hooks=(), resume=None) -> RunResult` — (SFT
  warm start,) evaluate, RL through the pipeline, evaluate, doctor; one run directory.
  `sft(...)` and `evaluate(...)` are `agentax sft` and `agentax eval`.
* `RunConfig` and its sections (`RunSection`, `InitConfig`, `EnvConfig`, `AgentConfig`,
  `TasksConfig`, `SFTConfig`, `EvalConfig`, `TracingConfig`, `ScaleConfig`; the rest are the
  library's own configs); `as_config` (from a RunConfig, a mapping, a YAML file, a recipe or a run
  directory), `load_config(path, overrides)`, `parse_overrides`, `dump_config`,
  `resolve_config`.
* `Hook(fn, every=N)` with `StepInfo`: per-step work of a run; `SFTPhase`: the warm start.
* Run directories: `is_run_dir`, `run_config` (the config a run was written with),
  `load_run_model`, `read_transcripts`; `build_tokenizer`, `build_engine` (the run's parts).
* `Interrupted`: a signal stopped the run (with a checkpoint; `train(run_dir)` continues).
"""

from agentax.run._api import RunResult, as_config, evaluate, sft, train
from agentax.run._build import build_engine, build_tokenizer, load_run_model, resolve_config
from agentax.run._config import (
    AgentConfig,
    EnvConfig,
    EvalConfig,
    InitConfig,
    RunConfig,
    RunSection,
    SFTConfig,
    ScaleConfig,
    TasksConfig,
    TracingConfig,
    dump_config,
    load_config,
    parse_overrides,
)
from agentax.run._hooks import Hook, StepInfo
from agentax.run._plots import render_timeline_png
from agentax.run._rundir import DOCTOR_REPORT, is_run_dir, run_config
from agentax.run._sft import SFTPhase
from agentax.run._signals import Interrupted
from agentax.run._startup import StartupHang
from agentax.run._transcripts import read_transcripts

__all__ = [
    "DOCTOR_REPORT",
    "AgentConfig",
    "EnvConfig",
    "EvalConfig",
    "Hook",
    "InitConfig",
    "Interrupted",
    "RunConfig",
    "RunResult",
    "RunSection",
    "SFTConfig",
    "SFTPhase",
    "ScaleConfig",
    "StartupHang",
    "StepInfo",
    "TasksConfig",
    "TracingConfig",
    "as_config",
    "build_engine",
    "build_tokenizer",
    "dump_config",
    "evaluate",
    "is_run_dir",
    "load_config",
    "load_run_model",
    "parse_overrides",
    "read_transcripts",
    "render_timeline_png",
    "resolve_config",
    "run_config",
    "sft",
    "train",
]
