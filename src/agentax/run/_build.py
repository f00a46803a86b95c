"""Builds the live pieces of a run from a `RunConfig`: tokenizer, model, task suite, engine.

`build_suite_for` resolves the user code the config names (environment, agent, tasks,
demonstrations, reward), calls each factory once and checks what it returns, so that a wrong
path or a factory of the wrong type fails in a second with one line, before any compilation.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flax import nnx

from agentax.run._config import DEMO_MODEL, RunConfig
from agentax.run._startup import StartupHang, call_bounded, close_bounded
from agentax.config import ConfigError, replace
from agentax.engine import Engine, enable_compilation_cache
from agentax.models import ModelConfig, Transformer, load_pretrained, read_hf_config
from agentax.records import Message, Task
from agentax.text import load_tokenizer

__all__ = ["TaskSuite", "build_engine", "build_mesh", "build_model", "build_suite_for",
           "build_tokenizer", "load_run_model", "resolve_config"]

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
        from agentax.run._rundir import run_config

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
        from agentax.run._rundir import run_config

        source = run_config(cfg.init.from_run).init.tokenizer_source
    return load_tokenizer(source)


def latest_checkpoint(run_dir: str | Path) -> tuple[Path, str] | None:
    """(checkpoints dir, trainer kind 'rl' | 'sft') of a run's newest checkpoint, or None."""
    from agentax.run._rundir import CHECKPOINT_DIR
    from agentax.train import latest_checkpoint_step, read_checkpoint_meta

    ckpt = Path(run_dir) / CHECKPOINT_DIR
    step = latest_checkpoint_step(ckpt)
    if step is None:
        return None
    return ckpt, read_checkpoint_meta(ckpt / f"step_{step}")["kind"]


def build_mesh(cfg: RunConfig) -> Any:
    """The trainers' device mesh from `trainer.mesh` (None when unset: one device).

    Raises:
      ConfigError: the mesh needs more devices than there are.
    """
    if cfg.trainer.mesh is None:
        return None
    from agentax.train import make_mesh

    sizes = {axis: int(n) for axis, n in cfg.trainer.mesh.items()}
    try:
        return make_mesh(**sizes)
    except ValueError as e:
        raise ConfigError(f"trainer.mesh={sizes}: {e}; or make trainer.mesh smaller") from None


def load_run_model(run_dir: str | Path, cfg: RunConfig) -> Transformer:
    """The policy saved in `run_dir`'s newest checkpoint (RL or SFT)."""
    from agentax.train import RLTrainer, SFTTrainer

    found = latest_checkpoint(run_dir)
    if found is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint yet ({run_dir}/checkpoints/step_N)")
    ckpt, kind = found
    base = Transformer(cfg.model, rngs=nnx.Rngs(cfg.run.seed))
    trainer_cls = RLTrainer if kind == "rl" else SFTTrainer
    trainer = trainer_cls(base, cfg.trainer, mesh=build_mesh(cfg))
    trainer.restore_checkpoint(ckpt)
    return trainer.export_model(release=True)


def build_model(cfg: RunConfig) -> Transformer:
    """The starting policy: a checkpoint (init.model_path / init.from_run) or a fresh model.

    Also switches on JAX's persistent compilation cache (`$AGENTAX_COMPILATION_CACHE`, default
    ~/.cache/agentax/jax; empty = off), so a second run or a resume does not recompile.
    """
    cache_dir = os.environ.get("AGENTAX_COMPILATION_CACHE", "~/.cache/agentax/jax")
    if cache_dir:
        enable_compilation_cache(cache_dir)
    if cfg.init.model_path is not None:
        return load_pretrained(cfg.init.model_path, dtype=cfg.init.dtype)
    if cfg.init.from_run is not None:
        from agentax.run._rundir import run_config

        return load_run_model(cfg.init.from_run, run_config(cfg.init.from_run))
    return Transformer(cfg.model, rngs=nnx.Rngs(cfg.run.seed))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSuite:
    """What a run needs from "the task": tasks, per-episode factories, reward, demonstrations."""

    name: str
    """The environment factory's path (for the summary)."""
    train_tasks: tuple[Task, ...]
    eval_tasks: tuple[Task, ...]
    make_env: Callable[[], Any]
    """A fresh environment for one episode."""
    make_agent: Callable[[], Any]
    """A fresh agent for one episode."""
    reward_fn: Callable[..., Any] | None = None
    """Extra reward on the final answer (env.reward), computed by the collector."""
    demos: Callable[[int, int], list[list[Message]]] | None = None
    """`demos(n, seed)` -> n demonstration conversations, or None."""
    tools: tuple[dict[str, Any], ...] = ()
    """Tool schemas the agent lists in its prompt (SFT renders demonstrations with them)."""


def _factory(path: str, kwargs: Any, field: str, check: Callable[[Any], str | None],
             timeout_s: float):
    """A zero-argument factory for `path(**kwargs)`, called once here (within `timeout_s`) and
    type-checked."""
    from agentax.run._imports import resolve_callable

    fn = resolve_callable(path, field=f"{field}.factory")
    kwargs = dict(kwargs)

    def make() -> Any:
        return fn(**kwargs)

    try:
        probe = call_bounded(make, timeout_s=timeout_s, what=f"{field}.factory={path}",
                             knob="run.startup_timeout_s")
    except StartupHang:
        raise
    except Exception as e:  # noqa: BLE001 - the user's factory failed: say where
        raise ConfigError(f"{field}.factory={path} failed when called with {field}.kwargs="
                          f"{kwargs}: {type(e).__name__}: {e}") from None
    problem = check(probe)
    if problem:
        raise ConfigError(f"{field}.factory={path} returned {type(probe).__name__}; {problem}")
    return make, probe


def _env_problem(env: Any) -> str | None:
    from agentax.envs import Environment

    if isinstance(env, Environment):
        return None
    if all(callable(getattr(env, m, None)) for m in ("reset", "step")):
        return None
    return "expected an agentax.envs.Environment (or an object with reset(task) and step(action))"


def _agent_problem(agent: Any) -> str | None:
    from agentax.agents import Agent

    return None if isinstance(agent, Agent) else "expected an agentax.agents.Agent"


def _is_sync_env(env: Any) -> bool:
    """A plain object with synchronous reset/step (not an Environment, not an episode driver)."""
    import inspect

    from agentax.contracts import EpisodeDriver
    from agentax.envs import Environment

    return not isinstance(env, (Environment, EpisodeDriver)) and not (
        inspect.iscoroutinefunction(env.reset) and inspect.iscoroutinefunction(env.step))


def _process_env_factory(cfg: RunConfig, probe: Any) -> Callable[[], Any]:
    """Episodes of a synchronous environment in worker processes (`env.sync_isolation`), with
    the limits the environment declares (read from the probe, as `ensure_async_env` does)."""
    from agentax.envs import ProcessEnvironment, ensure_async_env

    adapted = ensure_async_env(probe)
    limits = {k: getattr(adapted, k) for k in (
        "max_steps", "reset_timeout_s", "step_timeout_s", "close_timeout_s")}
    path, kwargs = cfg.env.factory, dict(cfg.env.kwargs)
    ProcessEnvironment.warm_up(path)
    return lambda: ProcessEnvironment(path, kwargs, **limits)


def _task_list(value: Any, what: str) -> tuple[Task, ...]:
    if not isinstance(value, Sequence) or not all(isinstance(t, Task) for t in value):
        raise ConfigError(f"tasks.factory returned {what} that is not a sequence of agentax Task")
    return tuple(value)


def _load_tasks(cfg: RunConfig) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    from agentax.run._imports import resolve_callable
    from agentax.recipes import load_tasks

    t = cfg.tasks
    if t.factory:
        fn = resolve_callable(t.factory, field="tasks.factory")
        try:
            out = call_bounded(
                lambda: fn(num_train=t.num_train, num_eval=t.num_eval, seed=cfg.run.seed,
                           **t.kwargs),
                timeout_s=cfg.run.startup_timeout_s, what=f"tasks.factory={t.factory}",
                knob="run.startup_timeout_s")
        except StartupHang:
            raise
        except Exception as e:  # noqa: BLE001 - the user's factory failed: say where
            raise ConfigError(f"tasks.factory={t.factory} failed: {type(e).__name__}: {e}") from None
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ConfigError(f"tasks.factory={t.factory} must return (train_tasks, eval_tasks), "
                              f"got {type(out).__name__}")
        train, held = _task_list(out[0], "train tasks"), _task_list(out[1], "eval tasks")
    else:
        rows = load_tasks(t.train_file, prefix="train")  # type: ignore[arg-type]
        if t.eval_file:
            held = tuple(load_tasks(t.eval_file, limit=t.num_eval, prefix="eval"))
            train = tuple(rows)
        else:
            if len(rows) <= t.num_eval:
                raise ConfigError(f"{t.train_file} has {len(rows)} tasks, not more than "
                                  f"tasks.num_eval={t.num_eval}: give tasks.eval_file or lower it")
            cut = len(rows) - t.num_eval
            train, held = tuple(rows[:cut]), tuple(rows[cut:])
        if t.num_train:
            train = train[:t.num_train]
    if not train:
        raise ConfigError("no training tasks: raise tasks.num_train or check tasks.train_file")
    return train, held


def _reward(name: str) -> Callable[..., Any] | None:
    from agentax.run._imports import is_import_path, resolve_callable
    from agentax.rewards import get_reward

    if not name:
        return None
    if is_import_path(name):
        return resolve_callable(name, field="env.reward")
    try:
        return get_reward(name)
    except KeyError as e:
        raise ConfigError(f"env.reward: {e.args[0]}") from None


def build_suite_for(cfg: RunConfig) -> TaskSuite:
    """Resolves and checks the config's environment, agent, tasks, reward and demonstrations.

    Raises:
      ConfigError: a path does not resolve, a factory fails or returns the wrong type.
    """
    from agentax.run._imports import resolve_callable
    from agentax.recipes import load_demos_jsonl

    limit = cfg.run.startup_timeout_s
    make_env, env = _factory(cfg.env.factory, cfg.env.kwargs, "env", _env_problem, limit)
    # The probe's close: bounded like an episode's (collector.close_timeout_s).
    close_bounded(env, timeout_s=cfg.collector.close_timeout_s,
                  what=f"env.close() of env.factory={cfg.env.factory}",
                  knob="collector.close_timeout_s")
    if cfg.env.sync_isolation == "process" and _is_sync_env(env):
        make_env = _process_env_factory(cfg, env)
    make_agent, agent = _factory(cfg.agent.factory, cfg.agent.kwargs, "agent", _agent_problem,
                                 limit)
    train, held = _load_tasks(cfg)
    demos = None
    if cfg.sft.data:
        data = cfg.sft.data
        demos = lambda n, seed: load_demos_jsonl(data)  # noqa: E731
    elif cfg.sft.demos:
        demo_fn = resolve_callable(cfg.sft.demos, field="sft.demos")
        demo_kwargs = dict(cfg.sft.demos_kwargs)
        demos = lambda n, seed: demo_fn(train, n, seed, **demo_kwargs)  # noqa: E731
    return TaskSuite(name=cfg.env.factory, train_tasks=train, eval_tasks=held,
                     make_env=make_env, make_agent=make_agent, reward_fn=_reward(cfg.env.reward),
                     demos=demos, tools=tuple(agent.tools or ()))


def build_roles(spec: Mapping[str, str], tokenizer: Any, *,
                snapshot: Any = None) -> dict[str, Any] | None:
    """`env.roles` / `eval.roles` as the collector's `RolePolicy` mapping (None when empty).

    A 'snapshot:N' role plays `snapshot` (the run's `SnapshotPolicy`); without one (an
    evaluation outside training) it plays the collector's engine, untrained.

    Raises:
      ConfigError: a player's path does not resolve, or its factory fails or returns neither a
        GenerateFn nor a function of the conversation text.
    """
    from agentax.run._sections import TRAINED_ROLE, snapshot_every
    from agentax.run._imports import resolve_callable
    from agentax.rollout import FunctionPolicy, RolePolicy

    if not spec:
        return None
    out: dict[str, Any] = {}
    for role, value in spec.items():
        if value == TRAINED_ROLE:
            out[role] = RolePolicy()
            continue
        if snapshot_every(value) is not None:
            out[role] = RolePolicy(engine=snapshot, trained=False)
            continue
        factory = resolve_callable(value, field=f"roles.{role}")
        try:
            player = factory()
        except Exception as e:  # noqa: BLE001 - the user's factory failed: say where
            raise ConfigError(f"roles.{role}={value} failed when called: {type(e).__name__}: {e}") from None
        if callable(getattr(player, "generate", None)):
            out[role] = RolePolicy(engine=player, trained=False)
        elif callable(player):
            out[role] = RolePolicy(engine=FunctionPolicy(player, tokenizer), trained=False)
        else:
            raise ConfigError(f"roles.{role}={value} returned {type(player).__name__}; expected a "
                              "GenerateFn (generate/release) or a function (text) -> reply")
    return out


def build_snapshot(cfg: RunConfig, trainer: Any, tokenizer: Any, *, version: int = 0) -> Any:
    """The run's `SnapshotPolicy` when env.roles has a 'snapshot:N' role (else None): an
    engine of its own (cfg.engine's shape) on the trainer's current weights."""
    from agentax.run._sections import snapshot_every
    from agentax.rollout import SnapshotPolicy

    every = next((n for n in map(snapshot_every, cfg.env.roles.values()) if n), None)
    if every is None:
        return None
    return SnapshotPolicy(build_engine(cfg, trainer.export_model(), tokenizer, version=version),
                          every)


def build_engine(cfg: RunConfig, model: Transformer, tokenizer: Any, *, version: int = 0) -> Engine:
    """The engine, on one device (a model sharded over the trainer's mesh is gathered onto the
    mesh's first device)."""
    return Engine(model, cfg.engine, eos_token_ids=tokenizer.eos_token_ids, tokenizer=tokenizer,
                  policy_version=version)
