"""The `Collector`: runs episodes as asyncio tasks against the continuous-batching engine.

One episode: reset the environment, let the agent turn the observation into messages, call the
engine (continuing the same engine sequence between turns, so only new tokens are prefilled),
let the agent parse the reply into an action, step the environment, repeat until done. Many
episodes run at once; the engine batches their model calls, environment work overlaps.

An environment reports per-episode numbers of its own (a solved flag, a distance, tool use) as
`StepResult.info["metrics"]`, a mapping of names to numbers; they end up in
`Trajectory.info["metrics"]`, where `agentax train` aggregates them.

Every wait on the outside world is bounded (model call, reset/step via the environment's own
limits, close, reward, the whole episode). Whatever happens, an episode returns a
`Trajectory` with a typed status, releases its engine sequence and closes its environment.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentax._aio import bounded
from agentax.agents import Agent, TrajectoryBuilder
from agentax.contracts import GENERATE_FN_MEMBERS, EpisodeDriver, GenerateFn, check_engine_client
from agentax.engine import PromptTooLong
from agentax.envs import (
    SINGLE_ROLE,
    EnvError,
    MultiAgentEnvironment,
    RoleStep,
    as_multi_agent,
    compute_reward,
    ensure_async_env,
)
from agentax.records import (
    Message,
    Observation,
    SamplingParams,
    StepResult,
    Task,
    Trajectory,
    TrajectoryStatus,
)
from agentax.trace import get_tracer, names

__all__ = ["Collector", "CollectorConfig", "GenerateFn", "RolePolicy", "cut_short", "episode_seed"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollectorConfig:
    """Limits of episode collection."""

    max_turns: int = 8
    """Model calls per episode before it is truncated."""
    max_episode_tokens: int = 1024
    """Token budget of a whole episode (prompt + generated + observations); truncated beyond.
    A first prompt that fills it alone ends the episode as `model_error` ("prompt_too_long")."""
    model_timeout_s: float = 120.0
    """Limit for one model call (queueing for a slot included)."""
    reward_timeout_s: float = 30.0
    """Limit for the collector's reward stage (when a reward_fn is given)."""
    episode_timeout_s: float = 600.0
    """Limit for a whole episode."""
    close_timeout_s: float = 10.0
    """Backstop limit for closing an environment. Deliberately separate from the environment's
    own `Environment.close_timeout_s` (set by the environment's author, per environment class):
    this one also bounds environments that do not subclass `Environment`."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_episode_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"collector.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("model_timeout_s", "reward_timeout_s", "episode_timeout_s", "close_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and value != float("inf")):  # also rejects NaN
                raise ValueError(f"collector.{name} must be a positive number of seconds, got {value}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolePolicy:
    """Which model plays a role of a multi-agent episode, and whether the role trains.

    Every role on the collector's own engine (`engine=None`) samples from the trained policy,
    so several roles share it (self-play); a role on another `GenerateFn` (a fixed scripted
    player, `FunctionPolicy`, another model's engine, a frozen snapshot's engine) goes through
    the same loop, limits and timeouts but never trains.
    """

    engine: Any = None
    """The model that answers the role (a `GenerateFn`); None: the collector's engine."""
    trained: bool = True
    """Whether the role's trajectories are returned for training."""
    sampling: SamplingParams | None = None
    """The role's sampling (its seed is set per episode); None: the collector's."""

    def __post_init__(self) -> None:
        if self.trained and self.engine is not None:
            raise ValueError("RolePolicy(trained=True) samples from the collector's engine: "
                             "leave engine=None, or set trained=False for a role on another "
                             "model")
        if self.engine is not None:
            check_engine_client(self.engine, "RolePolicy.engine", GENERATE_FN_MEMBERS)


def episode_seed(run_seed: int, group_index: int, sample_index: int) -> int:
    """A 31-bit seed that depends only on (run, group, sample): never on batch composition."""
    digest = hashlib.blake2b(f"{run_seed}/{group_index}/{sample_index}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF


class Collector:
    """Runs episodes; one instance serves a whole run.

    Args:
      engine: an `Engine` (or anything with `generate` / `release`, see `GenerateFn`).
      tokenizer: the model's `agentax.text` tokenizer (its chat template renders prompts).
      env_factory: builds a fresh environment for one episode (`Environment` or a sync env).
      agent_factory: builds a fresh agent for one episode.
      sampling: sampling params of every model call (the seed is set per episode).
      config: limits.
      reward_fn: optional `(task, final_answer) -> float` computed after the episode, as its
        own stage (the engine sequence is released first), added to the environment's rewards
        (single-agent episodes only: a multi-agent environment gives each role its rewards).
      roles: for a `MultiAgentEnvironment`, role -> `RolePolicy` (every role of the
        environment needs one); None: every role samples from `engine` and trains.
        `agent_factory` may then be a mapping role -> factory.
    """

    def __init__(
        self,
        engine: GenerateFn,
        tokenizer: Any,
        env_factory: Callable[[], Any],
        agent_factory: Callable[[], Agent] | Mapping[str, Callable[[], Agent]],
        sampling: SamplingParams,
        config: CollectorConfig = CollectorConfig(),
        *,
        reward_fn: Callable[[Task, str], Any] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        roles: Mapping[str, RolePolicy] | None = None,
    ):
        if roles is not None:
            roles = dict(roles)
            for name, policy in roles.items():
                if not isinstance(policy, RolePolicy):
                    raise TypeError(f"roles[{name!r}] must be a RolePolicy, got {type(policy).__name__}")
            if not any(p.trained for p in roles.values()):
                raise ValueError(f"no role of {sorted(roles)} is trained; set "
                                 "RolePolicy(trained=True) on at least one")
        check_engine_client(engine, "Collector", GENERATE_FN_MEMBERS)
        self.roles = roles
        self.engine = engine
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.agent_factory = agent_factory
        self.sampling = sampling
        self.config = config
        self.reward_fn = reward_fn
        self.template_kwargs = template_kwargs or {}
        self.tracer = get_tracer()
        self._cuts = _CutWatch()

    async def run_episode(
        self, task: Task, *, seed: int, group_id: str = "", sample_index: int = 0
    ) -> Trajectory:
        """Runs one episode to its end; never raises except on cancellation. With several
        trained roles it returns the first role's trajectory (`run_episode_roles` returns all)."""
        return (await self.run_episode_roles(
            task, seed=seed, group_id=group_id, sample_index=sample_index))[0]

    async def run_episode_roles(
        self, task: Task, *, seed: int, group_id: str = "", sample_index: int = 0
    ) -> tuple[Trajectory, ...]:
        """Runs one episode to its end and returns one trajectory per trained role (one for a
        single-agent environment), each with `info["role"]` in a multi-agent episode; never
        raises except on cancellation."""
        tracer = self.tracer
        track = names.episode_track(f"{group_id}/{sample_index}")
        flow = tracer.new_flow_id()
        with tracer.span(
            names.EPISODE, track=track, flow_out=(flow,),
            args={names.ARG_EPISODE_ID: f"{group_id}/{sample_index}", "task_id": task.id},
        ) as span:
            trajs = await self._run(task, seed, group_id, sample_index, flow, track)
            span.set_arg(names.ARG_STATUS, trajs[0].status.value)
            rewards = trajs[0].info.get("role_rewards") or {  # untrained roles' too
                str(t.info["role"]): t.reward for t in trajs if "role" in t.info}
            if rewards:
                span.set_arg(names.ARG_ROLE_REWARDS, rewards)
            for traj in trajs:
                self._cuts.record(traj)
            return trajs

    def _failed(self, task: Task, sample_index: int, group_id: str, t0: float, flow: int,
                status: TrajectoryStatus, info: dict[str, Any]) -> tuple[Trajectory, ...]:
        """Empty trajectories of an episode that could not start, one per trained role."""
        roles = [r for r, p in (self.roles or {}).items() if p.trained] or [None]
        return tuple(TrajectoryBuilder(self.tokenizer).build(
            0.0, status, task_id=task.id, sample_index=sample_index, group_id=group_id,
            timings={"episode_s": time.perf_counter() - t0},
            info={**info, "turns": 0, "flow_id": flow, **({"role": r} if r else {})})
            for r in roles)

    def _make_roles(self, env: MultiAgentEnvironment, task: Task,
                    seed: int) -> dict[str, _Role]:
        out: dict[str, _Role] = {}
        single = getattr(env, "single", False)
        for i, name in enumerate(env.roles):
            if self.roles is not None and not single:
                if name not in self.roles:
                    raise _RoleError(f"the environment's role {name!r} has no policy in the "
                                     f"collector's roles {sorted(self.roles)}")
                policy = self.roles[name]
            else:
                policy = RolePolicy()
            factory = self.agent_factory
            if isinstance(factory, Mapping):
                key = name if name in factory else SINGLE_ROLE if single and len(factory) == 1 else None
                if key is None:
                    raise _RoleError(f"no agent factory for role {name!r} (agent_factory has "
                                     f"{sorted(factory)})")
                factory = factory[key] if key in factory else next(iter(factory.values()))
            agent = factory()
            params = policy.sampling or self.sampling
            # Role 0 keeps the episode's seed (a single agent samples as it always did).
            role_seed = seed if i == 0 else int(episode_seed(seed, i, 0))
            out[name] = _Role(
                name=name, agent=agent, engine=policy.engine or self.engine,
                trained=policy.trained, params=dataclasses.replace(params, seed=role_seed),
                builder=TrajectoryBuilder(
                    self.tokenizer, tools=agent.tools, task_id=task.id,
                    stop_ids=params.stop_ids, template_kwargs=self.template_kwargs))
        return out

    async def _run(
        self, task: Task, seed: int, group_id: str, sample_index: int, flow: int, track: str
    ) -> tuple[Trajectory, ...]:
        cfg = self.config
        t0 = time.perf_counter()
        made = stage = None
        env: MultiAgentEnvironment | None = None
        try:  # user code: a factory that raises (now, not at the start-up check) is a status
            stage = "env_factory"
            made = self.env_factory()
            if isinstance(made, EpisodeDriver):
                return await self._run_driven(made, task, seed, group_id, sample_index, flow)
            env = as_multi_agent(made)
            stage = "agent_factory"
            roles = self._make_roles(env, task, seed)
        except Exception as e:  # noqa: BLE001 - counted by reason; the breaker decides
            if env is not None:
                await self._cleanup(env, _EpisodeState())
            return self._failed(
                task, sample_index, group_id, t0, flow,
                TrajectoryStatus.ENV_ERROR if stage == "env_factory" else
                TrajectoryStatus.MODEL_ERROR,
                {"reason": f"{stage}_error", "error": f"{type(e).__name__}: {e}"[:500]})
        single = getattr(env, "single", False)
        state = _EpisodeState(roles=roles)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the coroutine in an inner
            # task whose exception is never retrieved when the episode is cancelled as it fails
            # (a breaker stopping the run printed one "Task exception was never retrieved" each).
            async with asyncio.timeout(cfg.episode_timeout_s):
                await self._loop(task, env, state, None if single else track)
        except _ModelTimeout:
            state.fail(TrajectoryStatus.TIMEOUT, "model_timeout",
                       f"no reply within model_timeout_s={cfg.model_timeout_s}")
        except TimeoutError:
            state.fail(TrajectoryStatus.TIMEOUT, "episode_timeout")
        except EnvError as e:
            state.fail(e.status, f"{e.call}_{e.kind}", str(e))
        except asyncio.CancelledError:
            state.fail(TrajectoryStatus.CANCELLED, "cancelled")
            await self._cleanup(env, state)
            raise
        except Exception as e:  # noqa: BLE001 - the engine or an agent broke: a typed status
            state.fail(TrajectoryStatus.MODEL_ERROR, type(e).__name__, str(e))
        if state.status not in (TrajectoryStatus.OK, TrajectoryStatus.TRUNCATED) and \
                state.acting is not None and not single:
            # One role's failure ends the episode for all: say whose it was.
            state.info["failed_role"] = state.acting
        await self._cleanup(env, state)
        if single:
            role = roles[SINGLE_ROLE]
            state.reward = role.reward
            await self._reward_stage(task, role.final_answer or "", state)
            role.reward = state.reward
        elapsed = time.perf_counter() - t0
        out = []
        for role in roles.values():
            if not role.trained:
                continue
            timings = {"episode_s": elapsed, **state.timings}
            if role.model_s:
                timings["model_s"] = role.model_s
            info = {"reason": state.reason, "turns": role.turns, "flow_id": flow, **state.info}
            if not single:
                info.update(role=role.name, roles=list(roles), episode_turns=state.turns,
                            role_rewards={r.name: r.reward for r in roles.values()})
            out.append(role.builder.build(
                role.reward, state.status, sample_index=sample_index, group_id=group_id,
                timings=timings, info=info))
        if not out:
            raise ValueError("the collector's roles train none of the environment's roles "
                             f"{list(roles)}; set RolePolicy(trained=True) on at least one")
        return tuple(out)

    async def _run_driven(
        self, env: Any, task: Task, seed: int, group_id: str, sample_index: int, flow: int
    ) -> tuple[Trajectory, ...]:
        """An environment that calls the model itself (`agentax.serve.OpenAIAgentEnvironment`:
        one trajectory, or one per trained role) within the limits, sampling, reward stage."""
        cfg = self.config
        t0 = time.perf_counter()
        params = dataclasses.replace(self.sampling, seed=seed)
        try:
            # drive_episode enforces episode_timeout_s; the margin guards against one that won't
            async with asyncio.timeout(cfg.episode_timeout_s + cfg.close_timeout_s):
                got = await env.drive_episode(
                    self.engine, self.tokenizer, task, sampling=params, config=cfg,
                    template_kwargs=self.template_kwargs)
        except TimeoutError:
            got = TrajectoryBuilder(self.tokenizer).build(
                0.0, TrajectoryStatus.TIMEOUT, task_id=task.id, info={"reason": "episode_timeout"})
        except asyncio.CancelledError:
            await self._cleanup(ensure_async_env(env), _EpisodeState())
            raise
        except Exception as e:  # noqa: BLE001 - a broken driver is a typed status
            got = TrajectoryBuilder(self.tokenizer).build(
                0.0, TrajectoryStatus.ENV_ERROR, task_id=task.id,
                info={"reason": type(e).__name__, "error": str(e)[:500]})
        trajs = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        closing = _EpisodeState(status=trajs[0].status)
        await self._cleanup(ensure_async_env(env), closing)
        out = []
        for traj in trajs:
            state = _EpisodeState(status=traj.status, reward=traj.reward, info=dict(closing.info))
            await self._reward_stage(task, str(traj.info.get("final_answer", "")), state)
            out.append(dataclasses.replace(
                traj, reward=state.reward, status=state.status, group_id=group_id,
                sample_index=sample_index,
                timings={"episode_s": time.perf_counter() - t0, **traj.timings},
                info={**traj.info, "flow_id": flow, **state.info}))
        return tuple(out)

    async def _reward_stage(self, task: Task, final_answer: str, state: "_EpisodeState") -> None:
        """Adds the run's reward function to an episode that ended normally."""
        if state.status in (TrajectoryStatus.OK, TrajectoryStatus.TRUNCATED) and self.reward_fn:
            with self.tracer.span(names.REWARD):
                try:
                    state.reward += await compute_reward(
                        self.reward_fn, task, final_answer, timeout_s=self.config.reward_timeout_s)
                except EnvError as e:
                    state.fail(e.status, e.kind, str(e))

    async def _loop(self, task: Task, env: MultiAgentEnvironment, state: "_EpisodeState",
                    track: str | None) -> None:
        """The one episode loop: a single-agent environment is its one-role case."""
        cfg, tracer, roles = self.config, self.tracer, state.roles
        for role in roles.values():
            role.agent.reset(task)
        with tracer.span(names.ENV_RESET):
            t = time.perf_counter()
            step = await env.reset(task)
            state.add_time("env_s", t)
        self._deliver(step, roles)
        name = step.next_role
        if not self._flush(roles[name], state):
            return
        while True:
            role = roles[name]
            budget = cfg.max_episode_tokens - role.builder.num_tokens
            if state.turns >= cfg.max_turns:
                state.status, state.reason = TrajectoryStatus.TRUNCATED, f"max_turns={cfg.max_turns}"
                return
            if budget <= 0:
                state.status = TrajectoryStatus.TRUNCATED
                state.reason = f"max_episode_tokens={cfg.max_episode_tokens}"
                return
            call = dataclasses.replace(role.params, max_tokens=min(role.params.max_tokens, budget))
            args = {"prompt_tokens": int(len(role.prompt))}
            if track is not None:
                args[names.ARG_ROLE] = name
            state.acting = name
            with tracer.span(names.MODEL_CALL, track=None if track is None else f"{track}/{name}",
                             args=args) as span:
                t = time.perf_counter()
                try:
                    async with asyncio.timeout(cfg.model_timeout_s):
                        completion = await role.engine.generate(
                            role.prompt, call, sequence_id=role.sequence_id)
                except TimeoutError:
                    raise _ModelTimeout from None  # told apart from the episode's own timeout
                except PromptTooLong as e:
                    # The engine's slot, not the episode budget, ran out: after a turn that is
                    # a full context (the turns so far train); before one, nothing can start.
                    if role.turns:
                        state.status, state.reason = TrajectoryStatus.TRUNCATED, "context_full"
                    else:
                        state.fail(TrajectoryStatus.MODEL_ERROR, "prompt_too_long", str(e))
                    return
                role.model_s += time.perf_counter() - t
                span.set_arg("generated_tokens", completion.num_tokens)
                span.set_arg("slot_wait_s", round(completion.queue_time_s, 6))
            role.sequence_id = completion.sequence_id
            role.turns += 1
            state.turns += 1
            reply = role.builder.add_completion(completion)
            action = role.agent.act(reply)
            if action.final_answer is not None:
                role.final_answer = action.final_answer
            with tracer.span(names.ENV_STEP):
                t = time.perf_counter()
                step = await env.step(name, action)
                state.add_time("env_s", t)
            state.acting = None
            own = step.observations.get(name)
            role.builder.record_step(action, StepResult(
                observation=own if own is not None else Observation(),
                reward=step.rewards.get(name, 0.0)))
            for other, reward in step.rewards.items():
                roles[other].reward += float(reward)
            state.add_metrics(step.info.get("metrics"))
            if step.done:
                if step.truncated:
                    state.status, state.reason = TrajectoryStatus.TRUNCATED, "env_truncated"
                return
            if completion.finish_reason.value in ("slot_full",):
                state.status, state.reason = TrajectoryStatus.TRUNCATED, "context_full"
                return
            self._deliver(step, roles)
            name = str(step.next_role)
            if not self._flush(roles[name], state):
                return

    @staticmethod
    def _deliver(step: RoleStep, roles: dict[str, "_Role"]) -> None:
        """Each role's new observation becomes messages of its agent, fed at its next turn."""
        for name, observation in step.observations.items():
            roles[name].pending.extend(roles[name].agent.observe(observation))

    def _flush(self, role: "_Role", state: "_EpisodeState") -> bool:
        """Renders what `role` saw since its last turn into the ids it is fed next; False
        when its first prompt leaves no room for a reply (the episode is over)."""
        cfg = self.config
        if role.builder.started:
            role.prompt = role.builder.add_observation(role.pending)
            role.pending = []
            return True
        role.prompt = role.builder.start(role.agent.messages)
        role.pending = []
        if role.builder.num_tokens >= cfg.max_episode_tokens:
            # Not a limit reached: no episode of this task can start (nothing to train on).
            state.acting = role.name
            state.fail(TrajectoryStatus.MODEL_ERROR, "prompt_too_long",
                       f"the first prompt is {role.builder.num_tokens} tokens and "
                       f"collector.max_episode_tokens={cfg.max_episode_tokens} leaves no room "
                       "for a reply: raise max_episode_tokens above it (with the engine's and "
                       "the trainer's max_seq_len) or shorten the system prompt, tool "
                       "descriptions or first observation")
            return False
        return True

    async def _cleanup(self, env: Any, state: "_EpisodeState") -> None:
        for holder, engine in [(state, self.engine)] + [(r, r.engine) for r in state.roles.values()]:
            if holder.sequence_id is not None:
                try:
                    engine.release(holder.sequence_id)
                except Exception:  # noqa: BLE001 - a dead engine has nothing left to release
                    pass
                holder.sequence_id = None
        try:
            await bounded(env.close(), self.config.close_timeout_s)
        except Exception:  # noqa: BLE001 - close failures are counted, never fatal
            state.info["close_failed"] = True


_log = logging.getLogger(__name__)

_CUT_ADVICE = {
    "max_episode_tokens": "raise collector.max_episode_tokens (with the engine's and the "
                          "trainer's max_seq_len), or shorten the prompts and sampling.max_tokens",
    "max_turns": "raise collector.max_turns if the task needs more model calls",
    "context_full": "raise the engine's max_seq_len (with collector.max_episode_tokens)",
}
_warned_cuts: set[str] = set()


def cut_short(traj: Trajectory) -> bool:
    """True when one of the collector's own limits (max_turns, max_episode_tokens, a full engine
    slot) ended the episode, not the environment or an error."""
    reason = str(traj.info.get("reason", "")).split("=")[0]
    return traj.status is TrajectoryStatus.TRUNCATED and reason in _CUT_ADVICE


class _CutWatch:
    """Warns (once per process and limit) when most recent episodes end cut by one of the
    collector's own limits: a budget too small for the task trains only on cut episodes, which
    nothing else in a run's output shows."""

    window, share = 64, 0.5

    def __init__(self) -> None:
        self._recent: collections.deque = collections.deque(maxlen=self.window)

    def record(self, traj: Trajectory) -> None:
        cut = cut_short(traj)
        reason = str(traj.info.get("reason", ""))
        self._recent.append((reason, len(traj.turns),
                             int(traj.turns[0].prompt_ids.size) if traj.turns else 0) if cut else None)
        if not cut or reason in _warned_cuts or len(self._recent) < self.window:
            return  # only a new cut can bring its limit to the share, and each warns once
        top = collections.Counter(r[0] for r in self._recent if r is not None).most_common(1)
        if not top or top[0][1] < self.share * self.window or top[0][0] in _warned_cuts:
            return
        reason, n = top[0]
        _warned_cuts.add(reason)
        cuts = [r for r in self._recent if r is not None and r[0] == reason]
        turns = sum(r[1] for r in cuts) / n
        prompt = sum(r[2] for r in cuts) / n
        _log.warning(
            "%d of the last %d episodes were cut short (%s) after %.1f model calls on average "
            "(first prompt %.0f tokens): %s", n, self.window, reason, turns, prompt,
            _CUT_ADVICE[reason.split("=")[0]])


class _ModelTimeout(Exception):
    """One model call outlived `model_timeout_s` (not an episode timeout)."""


@dataclasses.dataclass
class _EpisodeState:
    status: TrajectoryStatus = TrajectoryStatus.OK
    reason: str = "done"
    reward: float = 0.0
    turns: int = 0
    sequence_id: int | None = None
    final_answer: str | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    roles: dict[str, "_Role"] = dataclasses.field(default_factory=dict)
    acting: str | None = None
    """The role whose model call or step is under way (named when it fails)."""

    def fail(self, status: TrajectoryStatus, reason: str, message: str = "") -> None:
        self.status, self.reason = status, reason
        if message:
            self.info["error"] = message[:500]

    def add_metrics(self, metrics: Any) -> None:
        """An environment's per-episode numbers from `StepResult.info["metrics"]` (a later step's
        value of a name replaces an earlier one); they reach `Trajectory.info["metrics"]`."""
        if metrics:
            self.info.setdefault("metrics", {}).update(
                {str(k): float(v) for k, v in dict(metrics).items()})

    def add_time(self, key: str, start: float) -> None:
        self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - start


class _RoleError(Exception):
    """The collector's roles or agent factories do not cover the environment's roles."""


@dataclasses.dataclass
class _Role:
    """One role of an episode: its agent, token stream and model."""

    name: str
    agent: Agent
    builder: TrajectoryBuilder
    engine: GenerateFn
    params: SamplingParams
    trained: bool
    sequence_id: int | None = None
    prompt: Any = None
    """The ids the role is fed at its next turn."""
    pending: list[Message] = dataclasses.field(default_factory=list)
    """Messages the role's agent received since its last turn."""
    reward: float = 0.0
    turns: int = 0
    final_answer: str | None = None
    model_s: float = 0.0
