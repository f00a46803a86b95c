"""`RunConfig`: the one typed configuration of an `agentax` run, and how it is built.

A run is described by one frozen dataclass whose sections reuse the library's own configs
(`ModelConfig`, `EngineConfig`, `SamplingParams`, `CollectorConfig`, `TrainerConfig`,
`PipelineConfig`) plus a few small sections defined here (run, init, env, agent, tasks, sft,
eval, tracing). The environment, agent, tasks, demonstrations and reward are named by import
path ('package.module:callable'), so any user code plugs in; see agentax.run._imports. The RL algorithm (advantage estimator, policy loss, clipping, KL, off-policy
correction) lives in `trainer`, next to the step that uses it, so it has one source of truth.

Precedence: the defaults (the embedded CPU demo) < a YAML file < `section.field=value`
overrides from the command line; a file's `base: RECIPE|PATH` chain comes before the file, and
its relative paths resolve against its own directory (load_config). `run.seed` is the root seed: unless pipeline.seed or
trainer.seed is given explicitly, the loader sets both from it. YAML is only the serialised dataclass
(`agentax.config.from_dict` / `to_dict`): an unknown key is an error naming the nearest valid
key, and combinations that cannot work are rejected with the reason and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from agentax import algos
from agentax.config import ConfigError, check_values, from_dict, to_dict, frozen as _frozen
from agentax.engine import EngineConfig
from agentax.models import BYTE_VOCAB_SIZE, ModelConfig
from agentax.pipeline import PipelineConfig
from agentax.records import SamplingParams
from agentax.rollout import CollectorConfig
from agentax.train import TrainerConfig
from agentax.run._sections import (
    DEMO_AGENT,
    DEMO_DEMOS,
    DEMO_ENV,
    DEMO_TASKS,
    AgentConfig,
    EnvConfig,
    EvalConfig,
    InitConfig,
    RunSection,
    SFTConfig,
    TasksConfig,
    TracingConfig,
    snapshot_every,
)
from agentax.run._scale import ScaleConfig
from agentax.run._yaml import (
    _short,
    base_path,
    paths_relative_to_file,
    read_yaml,
    read_yaml_file,
    resolve_paths,
)

__all__ = [
    "AgentConfig",
    "EnvConfig",
    "EvalConfig",
    "InitConfig",
    "RunConfig",
    "RunSection",
    "SFTConfig",
    "ScaleConfig",
    "TasksConfig",
    "TracingConfig",
    "apply_overrides",
    "dump_config",
    "load_config",
    "parse_overrides",
    "validate",
]

# ----------------------------------------------------------------------------- the demo defaults

DEMO_MODEL = ModelConfig.tiny(
    num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=32
)
"""The embedded demo's model: a ~0.3M-parameter Qwen3-layout transformer on the byte vocabulary."""

def _demo_engine() -> EngineConfig:
    # One chunk shape (prompts and continuations are ~20-30 tokens) and prefill calls of at
    # most 8 rows (row buckets 1, 2, 4, 8): 5 kernels to compile instead of 7, about 2 s each
    # on 2 cores; 32 new episodes then take 4 prefill calls, which costs less than that.
    # Pages for max_slots sequences of max_seq_len ("auto", the engine's default): a group's
    # samples share their prompt's pages and decode reads each row's own tokens; a recipe
    # that raises max_seq_len or max_slots inherits a budget that grows with them.
    return EngineConfig(max_slots=32, max_seq_len=160, prefill_chunk=32, min_prefill_bucket=32,
                        max_prefill_rows=8, decode_steps_per_call=8, kv_cache_tokens="auto")

def _demo_sampling() -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=64)

def _demo_collector() -> CollectorConfig:
    # A right episode is at most ~112 tokens (question, call, result, answer); 128, not 150,
    # lets the trainer's rows be 128 long: RL steps ~20% cheaper (p50 0.33 s against 0.41 s).
    return CollectorConfig(max_turns=3, max_episode_tokens=128, model_timeout_s=120.0,
                           episode_timeout_s=300.0)

def _demo_trainer() -> TrainerConfig:
    # 1e-3 with Adam (whose steps do not shrink with the tiny RL gradients) unlearned the SFT
    # model's copying of the tool result within a few steps; 2e-4 improves it steadily, and
    # 3e-4 ends 2-5 points higher sampled on seeds 0-2 in the same 40 steps (4e-4: seed 2 worse).
    return TrainerConfig(learning_rate=3e-4, micro_batch_size=32, max_seq_len=128,
                         min_seq_bucket=128, seq_bucket_multiple=32, off_policy="tis",
                         is_cap=2.0)

def _demo_pipeline() -> PipelineConfig:
    # 2 questions x 16 samples per step, not 4 x 8: the same 32 trajectories, but a group of
    # 16 comes out all right less often than one of 8 once the model is good, so fewer groups
    # are generated only to be filtered (2,336 episodes started instead of 3,312-3,368; RL
    # 24 s against 30-32 s on a slow day). Seeds 0-2 after RL: 100/94.9, 98.4/93.4, 95.3/91.0
    # (greedy/sampled %) against 100/97.7, 100/95.3, 93.8/91.8 with 4 x 8.
    return PipelineConfig(mode="async", max_staleness=1, group_size=16, groups_per_step=2,
                          max_concurrency=32)

@_frozen
class RunConfig:
    """Everything `agentax train | sft | eval` needs. The defaults are the embedded CPU demo."""

    run: RunSection = dataclasses.field(default_factory=RunSection)
    """Run directory, RL steps, checkpoints, seed."""
    model: ModelConfig = DEMO_MODEL
    """Architecture of a freshly initialised model (see agentax.models.ModelConfig)."""
    init: InitConfig = dataclasses.field(default_factory=InitConfig)
    """Weights and tokenizer sources."""
    engine: EngineConfig = dataclasses.field(default_factory=_demo_engine)
    """The continuous-batching generation engine (agentax.engine.EngineConfig)."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """The environment (a factory, its arguments, an extra reward)."""
    agent: AgentConfig = dataclasses.field(default_factory=AgentConfig)
    """The agent (a factory and its arguments)."""
    tasks: TasksConfig = dataclasses.field(default_factory=TasksConfig)
    """Training and held-out tasks."""
    sampling: SamplingParams = dataclasses.field(default_factory=_demo_sampling)
    """Sampling of every training model call (the seed is set per episode)."""
    collector: CollectorConfig = dataclasses.field(default_factory=_demo_collector)
    """Episode limits (agentax.rollout.CollectorConfig)."""
    trainer: TrainerConfig = dataclasses.field(default_factory=_demo_trainer)
    """Optimizer, batch shapes and the RL algorithm (agentax.train.TrainerConfig)."""
    pipeline: PipelineConfig = dataclasses.field(default_factory=_demo_pipeline)
    """Sync/async mode, staleness, group size (agentax.pipeline.PipelineConfig)."""
    # Many small steps (the copying skill appears earlier and on more seeds than with 170 of
    # 48), each one 16 packed rows of 128 positions holding ~23 demonstrations: 103 ms a step
    # on 2 cores, where 24 demonstrations a step padded to 16 rows of 160 (71 % filled) took
    # 142 ms. 330 steps x ~23 = one pass over 7600 demonstrations.
    sft: SFTConfig = dataclasses.field(default_factory=lambda: SFTConfig(
        steps=330, batch_size=0, batch_tokens=2048, pack_length=128, learning_rate=3e-3,
        warmup_steps=10, schedule="constant", num_demos=7600))
    """Supervised warm start."""
    eval: EvalConfig = dataclasses.field(default_factory=lambda: EvalConfig(samples=4))
    """Held-out evaluation (the demo samples each question 4 times: 64 sampled episodes alone
    read a 92% policy anywhere from 85% to 98%)."""
    tracing: TracingConfig = dataclasses.field(default_factory=TracingConfig)
    """Trace, console, plots, doctor."""
    scale: ScaleConfig = dataclasses.field(default_factory=ScaleConfig)
    """Engines and environments in Ray actors (off: both in this process)."""

    def __post_init__(self) -> None:
        validate(self)

# ----------------------------------------------------------------------------- validation

def validate(cfg: RunConfig) -> None:
    """Rejects combinations that cannot work, saying why and what to change.

    Raises:
      ConfigError: the first problem found.
    """
    check_values(cfg)
    p, t, e, c = cfg.pipeline, cfg.trainer, cfg.engine, cfg.collector
    if e.cache_dtype not in (None, "float32", "bfloat16", "float16"):
        raise ConfigError(f"engine.cache_dtype: {e.cache_dtype!r} is not allowed; choose one of "
                          "'float32', 'bfloat16', 'float16' or null (the model's dtype)")
    every = next((n for n in map(snapshot_every, cfg.env.roles.values()) if n), None)
    if every is not None and every % p.publish_every:
        raise ConfigError(
            f"env.roles has 'snapshot:{every}', but weights are published every "
            f"pipeline.publish_every={p.publish_every} steps and the snapshot advances at a "
            f"publish: make N a multiple of {p.publish_every}")
    group_based = algos.advantage_spec(t.advantage).group_based
    if group_based and p.group_size < 2:
        raise ConfigError(
            f"trainer.advantage={t.advantage!r} compares samples within a group, so "
            f"pipeline.group_size={p.group_size} gives every sample zero advantage: set "
            "pipeline.group_size>=2 (e.g. 8), or use trainer.advantage=reinforce_pp")
    if group_based and cfg.sampling.temperature == 0:
        raise ConfigError(
            "sampling.temperature=0 makes all samples of a group identical (zero advantage "
            f"for {t.advantage!r}): set sampling.temperature>0 (e.g. 1.0)")
    # A parked episode holds pages, not a slot: fewer slots than episodes only queue turns.
    if e.max_seq_len <= c.max_episode_tokens:
        also = (f", and trainer.max_seq_len={t.max_seq_len} to {c.max_episode_tokens}"
                if t.max_seq_len + 1 < c.max_episode_tokens else "")  # both in one go
        raise ConfigError(
            f"engine.max_seq_len={e.max_seq_len} must exceed collector.max_episode_tokens="
            f"{c.max_episode_tokens} (a slot holds the whole episode): raise engine.max_seq_len "
            f"to {c.max_episode_tokens + 1} or more{also}")
    if t.max_seq_len + 1 < c.max_episode_tokens:
        raise ConfigError(
            f"trainer.max_seq_len={t.max_seq_len} is shorter than an episode may be "
            f"(collector.max_episode_tokens={c.max_episode_tokens}), so long trajectories would "
            f"be cut: set trainer.max_seq_len={c.max_episode_tokens}")
    if cfg.init.model_path is not None and cfg.init.from_run is not None:
        raise ConfigError("set only one of init.model_path and init.from_run")
    if cfg.init.model_path is None and cfg.init.tokenizer_source == "byte" \
            and cfg.model.vocab_size != BYTE_VOCAB_SIZE:
        raise ConfigError(
            f"model.vocab_size={cfg.model.vocab_size} does not fit the byte tokenizer "
            f"({BYTE_VOCAB_SIZE} ids): set model.vocab_size={BYTE_VOCAB_SIZE}, or give "
            "init.tokenizer=DIR / init.model_path=DIR")
    _check_demo_parts(cfg)
    if cfg.eval.every and cfg.eval.every > cfg.run.steps > 0:
        raise ConfigError(f"eval.every={cfg.eval.every} > run.steps={cfg.run.steps}: it would "
                          "never run; lower it or set it to 0")

def _check_demo_parts(cfg: RunConfig) -> None:
    """A config that swaps in its own environment must not keep the demo's other parts."""
    if cfg.env.factory == DEMO_ENV:
        return
    left = [f"{name}={value}" for name, value in (("agent.factory", cfg.agent.factory),
                                                  ("tasks.factory", cfg.tasks.factory))
            if value in (DEMO_AGENT, DEMO_TASKS)]
    if left:
        raise ConfigError(
            f"env.factory={cfg.env.factory} is your own, but {' and '.join(left)} still belong "
            "to the calculator demo: name your agent and tasks too")
    if cfg.sft.steps and not cfg.sft.data and cfg.sft.demos == DEMO_DEMOS:
        raise ConfigError(
            f"sft.steps={cfg.sft.steps} needs demonstrations for your environment: set sft.data="
            "PATH (JSONL of {\"messages\": [...]}), sft.demos='package.module:callable', or "
            "sft.steps=0")

# ----------------------------------------------------------------------------- building


def _section_names() -> list[str]:
    return [f.name for f in dataclasses.fields(RunConfig)]

def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
    """`["trainer.learning_rate=1e-3", "pipeline.mode=sync"]` -> a nested mapping.

    Values are read as YAML scalars/lists (`true`, `3`, `[a, b]`, `null`); strings need no
    quotes. Raises ConfigError for an argument that is not `section.field=value`.
    """
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep or not key or "." not in key:
            raise ConfigError(
                f"cannot read override {arg!r}: write section.field=value, e.g. "
                "trainer.learning_rate=1e-3 or pipeline.mode=sync")
        try:
            value = read_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        except ConfigError as e:
            raise ConfigError(f"override {arg!r}: {e}") from None
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {arg!r} sets a field inside {part!r}, which is a value")
        node[parts[-1]] = value
    return out

def _merge(base: Any, update: Mapping[str, Any], where: str = "") -> Any:
    if not isinstance(base, dict):
        return dict(update)
    out = dict(base)
    if "factory" in update and update["factory"] != out.get("factory"):
        out.pop("kwargs", None)  # another factory: the old one's arguments do not carry over
    if "demos" in update and update["demos"] != out.get("demos"):
        out.pop("demos_kwargs", None)  # the same for sft.demos
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, f"{where}{key}.")
        else:
            out[key] = value
    return out

def _check_sections(data: Mapping[str, Any], source: str) -> None:
    """Every key names a section, and every section is a mapping of fields."""
    valid = _section_names()
    for key, value in data.items():
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else f" Sections: {', '.join(valid)}."
            raise ConfigError(f"unknown config section '{key}' in {source}.{hint}")
        if not isinstance(value, Mapping) and not dataclasses.is_dataclass(value):
            shown = "empty" if value is None else f"{_short(value)}"
            raise ConfigError(
                f"{source}: section '{key}' is {shown}, not a mapping of fields: write its "
                f"fields under it (e.g. '{key}: {{{_example_field(key)}: ...}}') or remove it")


def _example_field(section: str) -> str:
    """A field of `section` to show in an example (e.g. 'steps' for run)."""
    import typing

    names = [f.name for f in dataclasses.fields(typing.get_type_hints(RunConfig)[section])]
    return next((n for n in ("steps", "factory", "learning_rate") if n in names), names[0])

def apply_overrides(cfg: RunConfig, data: Mapping[str, Any], source: str = "overrides") -> RunConfig:
    """`cfg` with the (nested, partial) mapping `data` merged over it, strictly validated."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    _check_sections(data, source)
    return _build(_merge(to_dict(cfg), data), [data], source)

_DERIVED_SEEDS = ("pipeline", "trainer")

def _given(data: Mapping[str, Any], section: str, key: str) -> bool:
    part = data.get(section)
    return isinstance(part, Mapping) and key in part

def _build(merged: dict[str, Any], given: Sequence[Mapping[str, Any]], source: str) -> RunConfig:
    """Imports run.imports, derives the seeds not given explicitly, builds and validates."""
    from agentax.run._imports import import_modules

    run = merged.get("run", {})
    import_modules(run.get("imports") if isinstance(run, Mapping) else None)
    if any(_given(g, "run", "seed") for g in given):
        for section in _DERIVED_SEEDS:
            if not any(_given(g, section, "seed") for g in given):
                merged[section] = {**merged[section], "seed": run["seed"]}
    try:
        return from_dict(RunConfig, merged)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None

def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                *, base: RunConfig | None = None,
                relative_to_file: bool | None = None) -> RunConfig:
    """Defaults (or `base`) < YAML file at `path` (after its `base:` chain) < command-line
    `overrides`, validated once.

    A file's `base: NAME|PATH` names a shipped recipe or another YAML file (relative to the
    naming file) whose fields come first. Relative paths in a file (`_yaml.FILE_PATH_FIELDS`)
    resolve against that file's directory; `relative_to_file=False` keeps them relative to
    the current directory (a run directory's config.yaml: agentax wrote it with the values as
    given); None = decide per file (`_yaml.paths_relative_to_file`). Overrides resolve
    against the current directory.
    """
    merged = to_dict(base if base is not None else RunConfig())
    source, given = "defaults", []
    if path is not None:
        path = os.fspath(path)
        if not os.path.isfile(path):
            what = "is a directory, not a YAML file" if os.path.isdir(path) else "does not exist"
            raise ConfigError(f"config file {path!r} {what}")
        data = _read_config_file(path, relative_to_file=relative_to_file)
        merged, source = _merge(merged, data), path
        given.append(data)
    if overrides:
        data = parse_overrides(overrides)
        _check_sections(data, "command-line overrides")
        if path is not None:
            _check_fits(given[0], data, path)
        merged = _merge(merged, data)
        given.append(data)
        source = f"{source} + overrides" if path is not None else "command-line overrides"
    return _build(merged, given, source)

def _check_fits(written: Mapping[str, Any], overrides: Mapping[str, Any], path: str,
                where: str = "") -> None:
    """An override that sets a field inside a value the file wrote as a scalar or list would
    silently replace it; say so instead."""
    for key, value in overrides.items():
        if not isinstance(value, Mapping) or key not in written:
            continue
        old, name = written[key], f"{where}{key}"
        if isinstance(old, Mapping):
            _check_fits(old, value, path, f"{name}.")
        elif old is not None:
            raise ConfigError(
                f"{path}: {name} is {_short(old)}, not a mapping, but an override sets "
                f"{name}.{next(iter(value))}: write {name} in {path} as a mapping of fields")


def _read_config_file(path: str, chain: tuple[str, ...] = (), *,
                      relative_to_file: bool | None = None) -> dict[str, Any]:
    """The sections of the config file at `path`: its `base:` chain's merged under its own,
    each file's relative paths resolved against its own directory (see load_config)."""
    data = read_yaml_file(path) or {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level (e.g. "
                          f"'run: {{steps: 5}}'), got {_short(data)}")
    data = dict(data)
    base = data.pop("base", None)
    _check_sections(data, path)
    if relative_to_file if relative_to_file is not None else paths_relative_to_file(path):
        data = resolve_paths(data, os.path.dirname(os.path.abspath(path)))
    if base is None:
        return data
    chain = (*chain, os.path.realpath(path))
    target = base_path(base, path)
    if os.path.realpath(target) in chain:
        raise ConfigError(f"{path}: base {base!r} leads back to {target} (a cycle of bases); "
                          "remove one of the base: lines")
    return _merge(_read_config_file(target, chain), data)


def dump_config(cfg: RunConfig) -> str:
    """The YAML text of `cfg` (every field, so the file alone reproduces the run)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)
