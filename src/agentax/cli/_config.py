"""`RunConfig`: the one typed configuration of an `agentax` run, and how it is built.

A run is described by one frozen dataclass whose sections reuse the library's own configs
(`ModelConfig`, `EngineConfig`, `SamplingParams`, `CollectorConfig`, `TrainerConfig`,
`PipelineConfig`) plus a few small sections defined here (run, init, env, agent, sft, eval,
tracing). The RL algorithm (advantage estimator, policy loss, clipping, KL, off-policy
correction) lives in `trainer`, next to the step that uses it, so it has one source of truth.

Precedence: the defaults (the embedded CPU demo) < a YAML file < `section.field=value`
overrides from the command line. YAML is only the serialised dataclass
(`agentax.config.from_dict` / `to_dict`): an unknown key is an error naming the nearest valid
key, and combinations that cannot work are rejected with the reason and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import yaml

from agentax import algos
from agentax.config import ConfigError, check_values, from_dict, to_dict, frozen as _frozen
from agentax.engine import EngineConfig
from agentax.models import BYTE_VOCAB_SIZE, ModelConfig
from agentax.pipeline import PipelineConfig
from agentax.records import SamplingParams
from agentax.rollout import CollectorConfig
from agentax.train import TrainerConfig

__all__ = [
    "AgentConfig",
    "EnvConfig",
    "EvalConfig",
    "InitConfig",
    "RunConfig",
    "RunSection",
    "SFTConfig",
    "TASKS",
    "TracingConfig",
    "apply_overrides",
    "dump_config",
    "load_config",
    "parse_overrides",
    "validate",
]

TASKS = ("calculator", "math", "math_tool")
"""Environments `env.task` can name (see agentax.recipes)."""


@_frozen
class RunSection:
    """Where the run lives and how long it trains."""

    name: str = ""
    """Run directory name under runs_dir; empty = a timestamp (e.g. 20250101-120000-train)."""
    runs_dir: str = "runs"
    """Parent folder of run directories."""
    steps: int = 40
    """RL optimizer steps (the total, counted across resumes)."""
    checkpoint_every: int = 0
    """Save a trainer checkpoint every k RL steps; 0 = only at the end."""
    seed: int = 0
    """Seed of model init, task generation and sampling (derived per component)."""

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError(f"run.steps must be >= 0, got {self.steps}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"run.checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"run.name {self.name!r} must be a plain folder name (no '/')")


@_frozen
class InitConfig:
    """Where the weights and the tokenizer come from."""

    model_path: str | None = None
    """Local Hugging Face checkpoint directory (config.json + *.safetensors). Its config.json
    gives the architecture, so the `model` section must be left at its default. None = a fresh
    randomly initialised `model`."""
    from_run: str | None = None
    """Start from the latest checkpoint of this run directory (e.g. an `agentax sft` run)."""
    tokenizer: str = ""
    """'byte', or a local tokenizer directory; empty = model_path when set, else 'byte'."""
    dtype: Literal["float32", "bfloat16"] | None = None
    """Compute dtype of a loaded checkpoint; None = the checkpoint's own."""

    @property
    def tokenizer_source(self) -> str:
        return self.tokenizer or self.model_path or "byte"


@_frozen
class EnvConfig:
    """The environment and its tasks."""

    task: Literal["calculator", "math", "math_tool"] = "calculator"
    """'calculator': built-in arithmetic with a calculator tool (generated, nothing to
    download). 'math': one-turn math word problems (GSM8K-style JSONL) scored by math_verify.
    'math_tool': the same problems, multi-turn, with the calculator tool."""
    train_file: str | None = None
    """JSONL of training problems for 'math' / 'math_tool': one {"question", "answer"} object
    a line (GSM8K's '#### 42' answers are understood)."""
    eval_file: str | None = None
    """JSONL of held-out problems (same format); None = the last num_eval_tasks of train_file."""
    num_train_tasks: int = 16000
    """Training tasks (generated ones for 'calculator'; a cap on the file otherwise, 0 = all)."""
    num_eval_tasks: int = 64
    """Held-out evaluation tasks, disjoint from the training tasks."""
    max_digits: int = 2
    """'calculator': largest operand width."""
    max_steps: int = 3
    """Agent turns per episode before the environment ends it."""
    reward: str = ""
    """Reward name from agentax.rewards; empty = the task's own (exact number / math_verify)."""

    def __post_init__(self) -> None:
        if self.num_train_tasks < 0 or self.num_eval_tasks < 0:
            raise ConfigError("env.num_train_tasks and env.num_eval_tasks must be >= 0")
        if self.max_digits < 2 or self.max_digits > 4:
            raise ConfigError(f"env.max_digits must be 2..4, got {self.max_digits}")
        if self.max_steps < 1:
            raise ConfigError(f"env.max_steps must be >= 1, got {self.max_steps}")


@_frozen
class AgentConfig:
    """How the agent prompts the model and reads its replies."""

    system_prompt: str | None = None
    """System message; None = the task's default, '' = no system message."""
    tool_format: str = "hermes"
    """Tool-call syntax: 'hermes' (Qwen, the byte template) or 'llama3'."""
    list_tools: bool = True
    """List the tool schemas in the prompt (the chat template's tool section). The tiny demo
    turns it off to keep byte-level prompts short; real models need it on."""


@_frozen
class SFTConfig:
    """Supervised warm start on demonstrations before RL (`agentax sft`, or in `train`)."""

    steps: int = 0
    """SFT optimizer steps; 0 = no warm start."""
    batch_size: int = 48
    """Demonstrations per step."""
    learning_rate: float = 1e-2
    """Peak learning rate (linear warmup, then the `schedule`)."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    schedule: str = "cosine"
    """After warmup: 'cosine' (decay over the remaining steps to trainer.min_lr_ratio of the
    peak) or 'constant'."""
    micro_batch_size: int = 16
    """Rows per micro-batch."""
    pack: bool = True
    """Pack several demonstrations per row (less padding)."""
    pack_length: int = 256
    """Row length when packing."""
    num_demos: int = 2000
    """Demonstrations generated by the task (the 'calculator' task's sloppy demonstrator)."""
    data: str | None = None
    """JSONL of chat demonstrations ({"messages": [...]} a line) instead of generated ones."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.micro_batch_size < 1:
            raise ConfigError("sft.steps must be >= 0 and sft.batch_size, sft.micro_batch_size >= 1")
        if self.learning_rate <= 0:
            raise ConfigError(f"sft.learning_rate must be > 0, got {self.learning_rate}")
        if self.schedule not in ("cosine", "constant"):
            raise ConfigError(f"sft.schedule must be 'cosine' or 'constant', got {self.schedule!r}")


@_frozen
class EvalConfig:
    """Held-out evaluation (before RL, every `every` steps, at the end, and `agentax eval`)."""

    greedy: bool = True
    """Evaluate the greedy policy (temperature 0) once per task."""
    samples: int = 1
    """Sampled evaluations per task at sampling.temperature; 0 = none."""
    every: int = 0
    """Also evaluate every k RL steps (greedy only); 0 = only before and after training."""
    max_concurrency: int = 32
    """Evaluation episodes in flight at once (each holds an engine slot)."""

    def __post_init__(self) -> None:
        if self.samples < 0 or self.every < 0 or self.max_concurrency < 1:
            raise ConfigError("eval.samples and eval.every must be >= 0, eval.max_concurrency >= 1")


@_frozen
class TracingConfig:
    """What the run records and shows."""

    enabled: bool = True
    """Write the Perfetto trace (RUN_DIR/trace.perfetto-trace) for `agentax doctor`."""
    console: bool = True
    """Show live progress (rich) on the terminal."""
    plots: bool = True
    """Save RUN_DIR/curves.png (success and tool-use rate per step) at the end."""
    tensorboard: bool = False
    """Also write TensorBoard event files to RUN_DIR/tensorboard."""
    doctor: bool = True
    """Print the doctor's summary at the end of `train`."""


# ----------------------------------------------------------------------------- the demo defaults

DEMO_MODEL = ModelConfig.tiny(
    num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=32
)
"""The embedded demo's model: a ~0.3M-parameter Qwen3-layout transformer on the byte vocabulary."""


def _demo_engine() -> EngineConfig:
    # One chunk shape (prompts and continuations are ~20-30 tokens): fewer kernels to compile.
    return EngineConfig(max_slots=32, max_seq_len=160, prefill_chunk=32, min_prefill_bucket=32,
                        decode_steps_per_call=8)


def _demo_sampling() -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=64)


def _demo_collector() -> CollectorConfig:
    return CollectorConfig(max_turns=3, max_episode_tokens=150, model_timeout_s=120.0,
                           episode_timeout_s=300.0)


def _demo_trainer() -> TrainerConfig:
    # 1e-3 with Adam (whose steps do not shrink with the tiny RL gradients) unlearned the SFT
    # model's copying of the tool result within a few steps; 2e-4 improves it steadily.
    return TrainerConfig(learning_rate=2e-4, micro_batch_size=32, max_seq_len=160,
                         min_seq_bucket=160, seq_bucket_multiple=32, off_policy="tis",
                         is_cap=2.0)


def _demo_pipeline() -> PipelineConfig:
    return PipelineConfig(mode="async", max_staleness=1, group_size=8, groups_per_step=4,
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
    """Environment and tasks."""
    agent: AgentConfig = dataclasses.field(
        default_factory=lambda: AgentConfig(system_prompt="", list_tools=False))
    """Prompting and reply parsing."""
    sampling: SamplingParams = dataclasses.field(default_factory=_demo_sampling)
    """Sampling of every training model call (the seed is set per episode)."""
    collector: CollectorConfig = dataclasses.field(default_factory=_demo_collector)
    """Episode limits (agentax.rollout.CollectorConfig)."""
    trainer: TrainerConfig = dataclasses.field(default_factory=_demo_trainer)
    """Optimizer, batch shapes and the RL algorithm (agentax.train.TrainerConfig)."""
    pipeline: PipelineConfig = dataclasses.field(default_factory=_demo_pipeline)
    """Sync/async mode, staleness, group size (agentax.pipeline.PipelineConfig)."""
    sft: SFTConfig = dataclasses.field(default_factory=lambda: SFTConfig(
        steps=170, batch_size=48, learning_rate=3e-3, warmup_steps=10, schedule="constant",
        num_demos=8160))
    """Supervised warm start."""
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    """Held-out evaluation."""
    tracing: TracingConfig = dataclasses.field(default_factory=TracingConfig)
    """Trace, console, plots, doctor."""

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
    try:
        from agentax.text import get_tool_parser

        get_tool_parser(cfg.agent.tool_format)
    except ValueError as err:
        raise ConfigError(f"agent.tool_format: {err}") from None
    if t.advantage in algos.GROUP_ESTIMATORS and p.group_size < 2:
        raise ConfigError(
            f"trainer.advantage={t.advantage!r} compares samples within a group, so "
            f"pipeline.group_size={p.group_size} gives every sample zero advantage: set "
            "pipeline.group_size>=2 (e.g. 8), or use trainer.advantage=reinforce_pp")
    if t.advantage in algos.GROUP_ESTIMATORS and cfg.sampling.temperature == 0:
        raise ConfigError(
            "sampling.temperature=0 makes all samples of a group identical (zero advantage "
            f"for {t.advantage!r}): set sampling.temperature>0 (e.g. 1.0)")
    if e.max_slots < p.max_concurrency:
        raise ConfigError(
            f"engine.max_slots={e.max_slots} < pipeline.max_concurrency={p.max_concurrency}: "
            "every episode in flight holds an engine slot (its KV cache stays parked between "
            f"turns); set engine.max_slots={p.max_concurrency} or pipeline.max_concurrency="
            f"{e.max_slots}")
    if e.max_slots < cfg.eval.max_concurrency:
        raise ConfigError(
            f"engine.max_slots={e.max_slots} < eval.max_concurrency={cfg.eval.max_concurrency}: "
            f"set eval.max_concurrency={e.max_slots}")
    if e.max_seq_len <= c.max_episode_tokens:
        raise ConfigError(
            f"engine.max_seq_len={e.max_seq_len} must exceed collector.max_episode_tokens="
            f"{c.max_episode_tokens} (a slot holds the whole episode): raise engine.max_seq_len "
            f"to {c.max_episode_tokens + 1} or more")
    if t.max_seq_len + 1 < c.max_episode_tokens:
        raise ConfigError(
            f"trainer.max_seq_len={t.max_seq_len} is shorter than an episode may be "
            f"(collector.max_episode_tokens={c.max_episode_tokens}), so long trajectories would "
            f"be cut: set trainer.max_seq_len={c.max_episode_tokens}")
    if c.max_turns < cfg.env.max_steps:
        raise ConfigError(
            f"collector.max_turns={c.max_turns} < env.max_steps={cfg.env.max_steps}: the "
            f"collector would cut episodes the environment allows; set collector.max_turns="
            f"{cfg.env.max_steps}")
    if cfg.init.model_path is not None and cfg.init.from_run is not None:
        raise ConfigError("set only one of init.model_path and init.from_run")
    if cfg.init.model_path is None and cfg.init.tokenizer_source == "byte" \
            and cfg.model.vocab_size != BYTE_VOCAB_SIZE:
        raise ConfigError(
            f"model.vocab_size={cfg.model.vocab_size} does not fit the byte tokenizer "
            f"({BYTE_VOCAB_SIZE} ids): set model.vocab_size={BYTE_VOCAB_SIZE}, or give "
            "init.tokenizer=DIR / init.model_path=DIR")
    if cfg.env.task in ("math", "math_tool") and not cfg.env.train_file:
        raise ConfigError(
            f"env.task={cfg.env.task!r} reads its problems from a JSONL file: set "
            "env.train_file=PATH (one {\"question\", \"answer\"} a line, GSM8K format works)")
    if cfg.env.task == "math" and cfg.env.max_steps != 1:
        raise ConfigError("env.task='math' is one turn: set env.max_steps=1")
    if cfg.sft.steps and cfg.env.task != "calculator" and not cfg.sft.data:
        raise ConfigError(
            f"sft.steps={cfg.sft.steps} needs demonstrations: env.task={cfg.env.task!r} does "
            "not generate them, so set sft.data=PATH (JSONL of {\"messages\": [...]}) or "
            "sft.steps=0")
    if cfg.eval.every and cfg.eval.every > cfg.run.steps > 0:
        raise ConfigError(f"eval.every={cfg.eval.every} > run.steps={cfg.run.steps}: it would "
                          "never run; lower it or set it to 0")


# ----------------------------------------------------------------------------- building


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that rejects a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"key {key!r} appears twice (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(text_or_file: Any) -> Any:
    """YAML -> Python objects, strictly (safe types only, no duplicate keys)."""
    return yaml.load(text_or_file, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


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
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, f"{where}{key}.")
        else:
            out[key] = value
    return out


def _check_sections(data: Mapping[str, Any], source: str) -> None:
    valid = _section_names()
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else f" Sections: {', '.join(valid)}."
            raise ConfigError(f"unknown config section '{key}' in {source}.{hint}")


def apply_overrides(cfg: RunConfig, data: Mapping[str, Any], source: str = "overrides") -> RunConfig:
    """`cfg` with the (nested, partial) mapping `data` merged over it, strictly validated."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    _check_sections(data, source)
    merged = _merge(to_dict(cfg), data)
    try:
        return from_dict(RunConfig, merged)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                *, base: RunConfig | None = None) -> RunConfig:
    """Defaults (or `base`) < YAML file at `path` < command-line `overrides`, validated once."""
    merged = to_dict(base if base is not None else RunConfig())
    source = "defaults"
    if path is not None:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ConfigError(f"config file {path!r} does not exist")
        with open(path, encoding="utf-8") as f:
            try:
                data = read_yaml(f) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"{path} is not valid YAML: {_one_line(e)}") from None
            except ConfigError as e:
                raise ConfigError(f"{path}: {e}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level")
        _check_sections(data, path)
        merged, source = _merge(merged, data), path
    if overrides:
        data = parse_overrides(overrides)
        _check_sections(data, "command-line overrides")
        merged = _merge(merged, data)
        source = f"{source} + overrides" if path is not None else "command-line overrides"
    try:
        return from_dict(RunConfig, merged)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def dump_config(cfg: RunConfig) -> str:
    """The YAML text of `cfg` (every field, so the file alone reproduces the run)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)
