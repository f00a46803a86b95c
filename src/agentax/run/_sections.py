"""The small sections of `RunConfig` defined here: run, init, env, agent, tasks, sft, eval,
tracing (the others are the library's own configs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from agentax.config import ConfigError, frozen as _frozen

__all__ = ["DEMO_AGENT", "DEMO_DEMOS", "DEMO_ENV", "DEMO_TASKS", "AgentConfig", "EnvConfig",
           "EvalConfig", "InitConfig", "RunSection", "SFTConfig", "TasksConfig", "TracingConfig"]


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
SNAPSHOT_ROLE = "snapshot"


def snapshot_every(spec: Any) -> int | None:
    """N of a role spec 'snapshot:N' (None for any other spec); raises ConfigError for a
    'snapshot:...' whose N is not a positive whole number."""
    if not isinstance(spec, str) or not spec.startswith(SNAPSHOT_ROLE + ":"):
        return None
    n = spec[len(SNAPSHOT_ROLE) + 1:].strip()
    if not n.isdigit() or int(n) < 1:
        raise ConfigError(f"{spec!r}: a snapshot role is 'snapshot:N' with N a positive whole "
                          "number of RL steps between two advances of the snapshot (e.g. "
                          "'snapshot:4')")
    return int(n)


def _check_roles(field: str, roles: Mapping[str, Any]) -> None:
    if not isinstance(roles, Mapping):
        raise ConfigError(f"{field} must map role names to 'trained', 'snapshot:N' or a "
                          f"player's 'package.module:callable', got {type(roles).__name__}")
    for role, spec in roles.items():
        try:
            if snapshot_every(spec) is not None:
                continue
        except ConfigError as e:
            raise ConfigError(f"{field}.{role}={e}") from None
        if not isinstance(spec, str) or (spec != TRAINED_ROLE and ":" not in spec):
            raise ConfigError(f"{field}.{role}={spec!r} must be 'trained', 'snapshot:N' (a "
                              "frozen snapshot of the trained policy, advanced every N RL "
                              "steps) or a fixed player's 'package.module:callable'")
        if spec != TRAINED_ROLE:
            _check_path(f"{field}.{role}", spec)
    if roles and TRAINED_ROLE not in roles.values():
        raise ConfigError(f"{field} trains no role: set at least one role to 'trained'")
    everies = {snapshot_every(s) for s in roles.values()} - {None}
    if len(everies) > 1:
        raise ConfigError(f"{field} has snapshot roles of different periods {sorted(everies)}: "
                          "the run keeps one snapshot; give them the same 'snapshot:N'")

def _check_path(field: str, value: str | None) -> None:
    from agentax.run._imports import is_import_path

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
    GRPO groups), 'snapshot:N' (a frozen snapshot of the trained policy, advanced to the
    current one every N RL steps; it samples from an engine of its own holding one extra copy
    of the weights, and never trains) or a fixed player's 'package.module:callable' (called
    with no arguments, it returns a GenerateFn or a function (conversation text) -> reply;
    never trained). Empty: every role of the environment trains."""

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
    first trained role (its reward and the environment's metrics). A 'snapshot:N' role plays
    the run's snapshot during training (when env.roles has one), elsewhere (`agentax eval`)
    the evaluated policy itself, untrained."""

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
