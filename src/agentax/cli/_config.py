"""`RunConfig`: the one typed configuration of an `agentax` run, and how it is built.

A run is described by one frozen dataclass whose sections reuse the library's own configs
(`ModelConfig`, `EngineConfig`, `SamplingParams`, `CollectorConfig`, `TrainerConfig`,
`PipelineConfig`) plus a few small sections defined here (run, init, env, agent, tasks, sft,
eval, tracing). The environment, agent, tasks, demonstrations and reward are named by import
path ('package.module:callable'), so any user code plugs in; see agentax.cli._imports. The RL algorithm (advantage estimator, policy loss, clipping, KL, off-policy
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
from agentax.cli._yaml import (
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
    "TasksConfig",
    "TracingConfig",
    "apply_overrides",
    "dump_config",
    "load_config",
    "parse_overrides",
    "validate",
]

@_frozen
class RunSection:
    """Where the run lives and how long it trains."""

    name: str = ""
    """Run directory name under runs_dir; empty = a timestamp (e.g. 20250101-120000-train)."""
    runs_dir: str = "runs"
    """Parent folder of run directories."""
    steps: int = 30
    """RL optimizer steps (the total, counted across resumes)."""
    checkpoint_every: int = 0
    """Save a trainer checkpoint every k RL steps; 0 = only at the end."""
    seed: int = 0
    """The root seed: model init, tasks, demonstrations, evaluation, and (unless set
    explicitly) pipeline.seed (RL sampling) and trainer.seed (trainer RNG) all derive from it."""
    imports: tuple[str, ...] = ()
    """Modules to import before the config is checked, for what they register
    (agentax.algos.register_advantage, agentax.rewards.register_reward)."""
    startup_timeout_s: float = 30.0
    """Limit for each first call of the env, agent and tasks factories while the run starts
    (the probe environment's close gets collector.close_timeout_s); a call past it stops the
    run with one line naming it."""

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

DEMO_ENV = "agentax.recipes.calculator:make_env"
DEMO_AGENT = "agentax.recipes.calculator:make_agent"
DEMO_TASKS = "agentax.recipes.calculator:tasks"
DEMO_DEMOS = "agentax.recipes.calculator:demos"

TRAINED_ROLE = "trained"


def _check_roles(field: str, roles: Mapping[str, Any]) -> None:
    if not isinstance(roles, Mapping):
        raise ConfigError(f"{field} must map role names to 'trained' or a player's "
                          f"'package.module:callable', got {type(roles).__name__}")
    for role, spec in roles.items():
        if not isinstance(spec, str) or (spec != TRAINED_ROLE and ":" not in spec):
            raise ConfigError(f"{field}.{role}={spec!r} must be 'trained' or a fixed player's "
                              "'package.module:callable'")
        if spec != TRAINED_ROLE:
            _check_path(f"{field}.{role}", spec)
    if roles and TRAINED_ROLE not in roles.values():
        raise ConfigError(f"{field} trains no role: set at least one role to 'trained'")


def _check_path(field: str, value: str | None) -> None:
    from agentax.cli._imports import is_import_path

    if value and not is_import_path(value):
        raise ConfigError(f"{field}={value!r} must name a callable as 'package.module:function' "
                          "(e.g. agentax.envs:TaskEnvironment)")

@_frozen
class EnvConfig:
    """The environment: any callable that returns an `agentax.envs.Environment`."""

    factory: str = DEMO_ENV
    """'package.module:callable' called as factory(**kwargs) once per episode; it must return
    an agentax Environment (or an object with reset(task) / step(action)). Default: the
    embedded calculator demo's ToolEnvironment."""
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of env.factory (e.g. {max_steps: 8} for the built-in environments)."""
    reward: str = ""
    """Extra reward on the episode's final answer, added to the environment's own: a name
    registered with agentax.rewards.register_reward (e.g. math_verify) or
    'package.module:callable' (task, answer) -> float; empty = only the environment's."""
    sync_isolation: str = "process"
    """Where a synchronous environment (plain reset/step methods) runs: 'process' (each
    episode's environment in a worker process of its own, killed when a call outlives its
    timeout: a hung call costs its episode, never a thread) or 'thread' (the env thread pool:
    cheaper, but a hung call holds its thread for good). Async environments run on the loop."""
    roles: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Multi-agent environments: role -> 'trained' (samples from the policy being trained;
    several trained roles share it, as in self-play, and each yields its own trajectories and
    GRPO groups) or a fixed player's 'package.module:callable' (called with no arguments, it
    returns a GenerateFn or a function (conversation text) -> reply; never trained). Empty:
    every role of the environment trains."""

    def __post_init__(self) -> None:
        _check_roles("env.roles", self.roles)
        if not self.factory:
            raise ConfigError("env.factory is empty: name a callable that returns an Environment")
        _check_path("env.factory", self.factory)
        if self.sync_isolation not in ("process", "thread"):
            raise ConfigError(f"env.sync_isolation must be 'process' or 'thread', got "
                              f"{self.sync_isolation!r}")

@_frozen
class AgentConfig:
    """The agent: any callable that returns an `agentax.agents.Agent`."""

    factory: str = DEMO_AGENT
    """'package.module:callable' called as factory(**kwargs) once per episode; it must return
    an agentax Agent (e.g. agentax.agents:ModelAgent, agentax.agents:FrozenLakeAgent)."""
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of agent.factory (e.g. {system_prompt: "..."})."""

    def __post_init__(self) -> None:
        if not self.factory:
            raise ConfigError("agent.factory is empty: name a callable that returns an Agent")
        _check_path("agent.factory", self.factory)

@_frozen
class TasksConfig:
    """Training and held-out tasks: from files or from a factory."""

    factory: str | None = DEMO_TASKS
    """'package.module:callable' called as factory(num_train=, num_eval=, seed=, **kwargs) ->
    (train_tasks, eval_tasks), two sequences of agentax Task, disjoint. Set it to null to read
    tasks from train_file instead. Default: the calculator demo's generated questions."""
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of tasks.factory."""
    train_file: str | None = None
    """JSONL (or Parquet, with pyarrow) of training tasks, one object a row: 'prompt' (or
    'question' / 'problem'), 'answer' (GSM8K's '#### 42' is understood), optional 'id' and
    'meta'; other columns go to Task.meta. Needs tasks.factory=null."""
    eval_file: str | None = None
    """Held-out tasks, same format; None = the last num_eval rows of train_file."""
    num_train: int = 16000
    """Training tasks (generated by the factory; a cap on the file, 0 = all of it)."""
    num_eval: int = 64
    """Held-out evaluation tasks, disjoint from the training tasks."""

    def __post_init__(self) -> None:
        _check_path("tasks.factory", self.factory)
        if self.num_train < 0 or self.num_eval < 0:
            raise ConfigError("tasks.num_train and tasks.num_eval must be >= 0")
        if self.factory and (self.train_file or self.eval_file):
            raise ConfigError(
                f"tasks.factory={self.factory!r} and tasks.train_file/eval_file are both set: "
                "keep one (set tasks.factory=null to read tasks from files)")
        if not self.factory and not self.train_file:
            raise ConfigError("no tasks: set tasks.train_file=PATH (JSONL) or "
                              "tasks.factory='package.module:callable'")

@_frozen
class SFTConfig:
    """Supervised warm start on demonstrations before RL (`agentax sft`, or in `train`).

    The learning rate, warmup, schedule and batch shape here are SFT's own, deliberately apart
    from the RL ones in `trainer` (a warm start wants a rate 10-100x higher); every other
    optimizer knob (betas, weight decay, clipping, min_lr_ratio, sequence buckets, dtype) is
    shared from `trainer`.
    """

    steps: int = 0
    """SFT optimizer steps; 0 = no warm start."""
    batch_size: int = 48
    """Demonstrations per step; 0 when batch_tokens is set (exactly one of the two is)."""
    batch_tokens: int = 0
    """With pack: each step takes as many demonstrations as pack into this many positions
    (rows of pack_length, first-fit decreasing) instead of batch_size: one step shape, little
    padding. 0 = batch_size demonstrations a step."""
    learning_rate: float = 1e-2
    """Peak learning rate (linear warmup, then the `schedule`)."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """After warmup: 'cosine' (decay over the remaining steps to trainer.min_lr_ratio of the
    peak; the floor is shared with RL) or 'constant'."""
    micro_batch_size: int = 16
    """Rows per micro-batch."""
    pack: bool = True
    """Pack several demonstrations per row (less padding)."""
    pack_length: int = 256
    """Row length when packing (SFT rows are not lengthened to trainer.min_seq_bucket)."""
    num_demos: int = 2000
    """Demonstrations to generate with sft.demos."""
    demos: str | None = DEMO_DEMOS
    """'package.module:callable' called as demos(train_tasks, n, seed, **demos_kwargs) -> n
    conversations (lists of agentax Message) from the training tasks; default: the calculator
    demo's sloppy demonstrator. Ignored when sft.data is set."""
    demos_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of sft.demos (dropped when a file or override names another
    sft.demos, like env.kwargs with env.factory)."""
    data: str | None = None
    """JSONL of chat demonstrations ({"messages": [...]} a line) instead of generated ones."""
    checkpoint_every_s: float = 300.0
    """`agentax train` saves the SFT trainer (RUN_DIR/checkpoints/sft, the newest kept) at
    most this often, when SFT ends and when a signal stops it, so a resume continues SFT where
    it stopped; 0: only at the end and on a signal."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 0 or self.batch_tokens < 0 \
                or self.micro_batch_size < 1:
            raise ConfigError("sft.steps, sft.batch_size and sft.batch_tokens must be >= 0, "
                              "sft.micro_batch_size >= 1")
        if self.learning_rate <= 0:
            raise ConfigError(f"sft.learning_rate must be > 0, got {self.learning_rate}")
        # Exactly one: a batch_size set on top of the demo's batch_tokens must not be ignored.
        if self.batch_size and self.batch_tokens:
            raise ConfigError(
                f"sft.batch_size={self.batch_size} and sft.batch_tokens={self.batch_tokens} are "
                f"both set: keep one (sft.batch_tokens=0 for {self.batch_size} demonstrations a "
                f"step, or sft.batch_size=0 for steps of {self.batch_tokens} packed positions)")
        if not (self.batch_size or self.batch_tokens):
            raise ConfigError("set sft.batch_size (demonstrations a step) or sft.batch_tokens "
                              "(packed positions a step)")
        if self.batch_tokens and (not self.pack or self.batch_tokens < self.pack_length):
            raise ConfigError(f"sft.batch_tokens={self.batch_tokens} needs sft.pack=true and at "
                              f"least one row of sft.pack_length={self.pack_length} positions; "
                              "or take a fixed count: sft.batch_tokens=0 sft.batch_size=N")
        if self.checkpoint_every_s < 0:
            raise ConfigError(f"sft.checkpoint_every_s must be >= 0 (0: only at the end and on "
                              f"a signal), got {self.checkpoint_every_s}")
        _check_path("sft.demos", self.demos)
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
    roles: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Multi-agent environments: the roles during evaluation, as env.roles (e.g. the trained
    policy against a fixed baseline player); empty = env.roles. An episode is scored by its
    first trained role (its reward and the environment's metrics)."""

    def __post_init__(self) -> None:
        _check_roles("eval.roles", self.roles)
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
    """Save RUN_DIR/curves.png (the SFT loss; success and tool-use rate per RL step, over
    every segment of a resumed run) at the end."""
    tensorboard: bool = False
    """Also write TensorBoard event files to RUN_DIR/tensorboard."""
    doctor: bool = True
    """Print the doctor's summary at the end of `train` (the full report goes to
    RUN_DIR/doctor.txt)."""
    transcripts_fraction: float = 0.02
    """Share of the trained RL episodes written to RUN_DIR/transcripts.jsonl (the
    conversation, raw model text, parsed actions, reward, token counts, policy versions; read
    them with `agentax show RUN_DIR`). Chosen by a hash of run.seed and the episode, so a
    resume keeps the same ones; 0 = none, 1 = all."""
    eval_transcripts: int = 8
    """Episodes written to RUN_DIR/transcripts.jsonl from the start of every evaluation, per
    mode (greedy, sampled): the same tasks before and after RL; 0 = none."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.transcripts_fraction <= 1.0:
            raise ConfigError("tracing.transcripts_fraction must be in [0, 1] (a share of the "
                              f"trained episodes), got {self.transcripts_fraction}")
        if self.eval_transcripts < 0:
            raise ConfigError("tracing.eval_transcripts must be >= 0 (episodes per evaluation "
                              f"and mode), got {self.eval_transcripts}")

# ----------------------------------------------------------------------------- the demo defaults

DEMO_MODEL = ModelConfig.tiny(
    num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=32
)
"""The embedded demo's model: a ~0.3M-parameter Qwen3-layout transformer on the byte vocabulary."""

def _demo_engine() -> EngineConfig:
    # One chunk shape (prompts and continuations are ~20-30 tokens) and prefill calls of at
    # most 8 rows (row buckets 1, 2, 4, 8): 5 kernels to compile instead of 7, about 2 s each
    # on 2 cores; 32 new episodes then take 4 prefill calls, which costs less than that.
    # Pages for max_slots x max_seq_len ("auto"): the rows' memory, paged, so a group's samples
    # share their prompt's pages and decode reads each row's own tokens; a recipe that raises
    # max_seq_len or max_slots inherits a budget that grows with them.
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
    # With a paged cache a parked episode holds pages, not a slot: fewer slots only queue turns.
    if e.max_slots < p.max_concurrency and not e.kv_cache_tokens:
        raise ConfigError(
            f"engine.max_slots={e.max_slots} < pipeline.max_concurrency={p.max_concurrency}: "
            "every episode in flight holds an engine slot (its KV cache stays parked between "
            f"turns); set engine.max_slots={p.max_concurrency} or pipeline.max_concurrency="
            f"{e.max_slots}, or page the cache (engine.kv_cache_tokens: parked episodes then "
            "hold pages, not slots)")
    if e.max_slots < cfg.eval.max_concurrency and not e.kv_cache_tokens:
        raise ConfigError(
            f"engine.max_slots={e.max_slots} < eval.max_concurrency={cfg.eval.max_concurrency}: "
            f"set eval.max_concurrency={e.max_slots}")
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
    from agentax.cli._imports import import_modules

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
