"""`OpenAIAgentEnvironment`: train an agent written against the OpenAI API, unchanged.

The agent is a black box: an `async def run(client: openai.AsyncOpenAI, task)` or any program run as a subprocess with `OPENAI_BASE_URL` / `OPENAI_API_KEY` set. It calls the
model itself; this environment gives each episode its own session on the engine's endpoint
(`ChatServer`, started once per engine on the collector's loop) and returns the session as the
episode's `Trajectory` (see `agentax.serve._session` for the continuation rule).

The `Collector` runs it like any environment (`env_factory`), through its episode-driver path:
an environment with `drive_episode` runs the whole episode itself, within the collector's
limits (episode timeout, model-call timeout, `max_turns`, `max_episode_tokens`, the run's
sampling and per-episode seed), and the collector adds its reward stage, accounting and
engine-sequence cleanup as for every episode. Weight updates apply mid-episode; each token
carries the policy version that produced it.

The reward, first that applies: a `Reward(x)` that `run` returns; a `{"reward": x}` POSTed to
`OPENAI_BASE_URL + "/reward"`; `reward_fn(task, final_answer)`; else 0 (and the collector's own
`reward_fn` is added, as for any environment). Any other value `run` returns -- a string, a
number, the SDK's `final_output` -- is the episode's final answer, not a reward: it is what
`reward_fn` judges (instead of the last reply without a tool call) and what the transcript
shows; when nothing scores it, one warning line names the agent.

An exception the agent raises is the environment's failure (`ENV_ERROR`, which drops the
episode's whole group from training) unless it is an outcome of what the model did:

* one listed in `outcomes` (by default `AGENT_OUTCOMES`: the OpenAI Agents SDK's
  `MaxTurnsExceeded` ends the episode TRUNCATED, its `ModelBehaviorError` — a call to a tool
  the agent does not have, an output that does not parse as its `output_type` — OK): the
  episode trains, its reward judged as above (0 when the agent never answered);
* any exception raised right after the endpoint rejected the model's reply (a reply that did
  not satisfy the request's `tool_choice` / `response_format` got a 400, and the agent let it
  propagate): OK, the rejected reply the last of its trajectory, reason `reply_rejected`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentax.envs import Environment, compute_reward
from agentax.records import Action, SamplingParams, StepResult, Task, Trajectory, TrajectoryStatus
from agentax.serve._server import shared_server
from agentax.serve._session import SessionLimits

__all__ = ["AGENT_OUTCOMES", "OpenAIAgentEnvironment", "Reward"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Reward:
    """A reward a black-box agent's `run` returns explicitly: `return Reward(1.0)`.

    Anything else `run` returns is its final answer, never a reward (a returned "825" is not
    worth 825).
    """

    value: float

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise TypeError(f"Reward(value) takes a number, got {type(self.value).__name__} {self.value!r}")
        if not math.isfinite(self.value):
            raise ValueError(f"Reward(value) must be finite, got {self.value}")
        object.__setattr__(self, "value", float(self.value))


def _answer_text(value: Any) -> str:
    """A returned non-reward value as the episode's final answer text."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    dump = getattr(value, "model_dump_json", None)  # pydantic output types of SDK agents
    if callable(dump):
        try:
            return str(dump())
        except Exception:  # noqa: BLE001 - fall back to str()
            pass
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, default=str)
        except (TypeError, ValueError):
            pass
    return str(value)


def _role_seed(seed: int, index: int) -> int:
    """A 31-bit seed for role `index` of an episode seeded `seed` (as the collector's
    `episode_seed(seed, index, 0)`; serve does not import rollout)."""
    digest = hashlib.blake2b(f"{seed}/{index}/0".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


AGENT_OUTCOMES: Mapping[str, TrajectoryStatus] = {
    "agents.exceptions.MaxTurnsExceeded": TrajectoryStatus.TRUNCATED,
    "agents.exceptions.ModelBehaviorError": TrajectoryStatus.OK,
}
"""Exceptions an agent raises because of what the model did, by the qualified name of their
class (or of a base class), and the status each ends an episode with (default `outcomes` of
`OpenAIAgentEnvironment`). Names, so that matching one imports nothing."""

_CLIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""`_SharedClientState` of each event loop."""
_CLOSERS: set[asyncio.Task] = set()
_WARNED_AGENTS: set[str] = set()
"""Agents whose unscored return value was already reported (one line per agent and process)."""


class _SharedClientState:
    """What every episode's `openai.AsyncOpenAI` of one event loop shares.

    * One HTTP connection pool (keep-alive connections reused across episodes; a fresh pool per
      episode costs ~70 ms of TLS-context setup alone, even for plain http). Requests to the
      engine's endpoint take the loopback transport (`agentax.serve._loopback`: plain HTTP/1.1
      on kept-alive asyncio streams, ~0.3 ms less of the loop's time a call than aiohttp's,
      itself ~0.3 ms less than httpx's own); any other request, the SDK's `DefaultAioHttpClient`
      transport (`openai[aiohttp]`) when aiohttp is installed, else its default one.
    * The SDK's platform tag: a new client looks it up on its first request in a worker thread
      (`asyncify(get_platform)`), one thread hop per episode that costs GIL handoffs on the
      loop the engine's step thread shares; it is the same value for every client, so the first
      client's is given to the others.

    The pool is closed when the loop's tasks are cancelled at its end (`asyncio.run`,
    `Pipeline.run`), so no "unclosed session" warnings are printed.
    """

    def __init__(self) -> None:
        import openai

        try:
            usual = openai.DefaultAioHttpClient()
        except RuntimeError:  # aiohttp not installed
            usual = openai.DefaultAsyncHttpxClient()
        self.loopback: Any = None
        httpx = _sdk_httpx(openai)
        if httpx is not None and isinstance(getattr(usual, "_transport", None),
                                            httpx.AsyncBaseTransport):
            from agentax.serve._loopback import loopback_transport

            # usual._transport: the SDK client's own transport, for what the loopback one
            # does not serve (another host, a streamed upload)
            self.loopback = loopback_transport(httpx, usual._transport)
            self.http = openai.DefaultAsyncHttpxClient(transport=self.loopback)
        else:
            self.http = usual
        self.platform: Any = None

    async def close_at_end(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await self.http.aclose()

    def client(self, base_url: str, api_key: str, timeout_s: float | None,
               endpoint: tuple[str, int] | None = None) -> Any:
        import openai

        if endpoint is not None and self.loopback is not None:
            self.loopback.serve(*endpoint)

        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                    timeout=timeout_s, http_client=self.http)
        if self.platform is not None and getattr(client, "_platform", "") is None:
            client._platform = self.platform
        return client

    def learn(self, client: Any) -> None:
        if self.platform is None:
            self.platform = getattr(client, "_platform", None)


def _sdk_httpx(openai: Any) -> Any:
    """The httpx module the SDK's clients are built on (`httpx2`, or `httpx` in older SDKs);
    None when it cannot be told."""
    import sys

    for cls in openai.DefaultAsyncHttpxClient.__mro__:
        if cls.__name__ == "AsyncClient":
            module = sys.modules.get(cls.__module__.split(".")[0])
            if all(hasattr(module, n) for n in ("AsyncBaseTransport", "AsyncByteStream", "Response",
                                                "RequestNotRead", "ReadTimeout", "ReadError")):
                return module
    return None


def _shared_client_state() -> _SharedClientState:
    loop = asyncio.get_running_loop()
    state = _CLIENTS.get(loop)
    if state is None:
        state = _CLIENTS[loop] = _SharedClientState()
        closer = loop.create_task(state.close_at_end())
        _CLOSERS.add(closer)  # the loop keeps only a weak reference to its tasks
        closer.add_done_callback(_CLOSERS.discard)
    return state


AgentFn = Callable[[Any, Task], Awaitable[Any]]


class OpenAIAgentEnvironment(Environment):
    """Runs a black-box OpenAI-API agent for one episode and records it token-exactly.

    Args:
      run: `async def run(client: openai.AsyncOpenAI, task)`, returning `Reward(x)`, None, or
        its final answer (any other value: the text `reward_fn` judges).
      command: instead of `run`, a program (argv) run as a subprocess with OPENAI_BASE_URL,
        OPENAI_API_KEY and AGENTAX_TASK (the task as JSON) in its environment.
      reward_fn: `(task, final_answer) -> float` when neither `run` nor the program reports a
        reward; the final answer is what `run` returned, else the last reply without a tool call.
      tool_format: tool-call parser of the endpoint ("hermes", "llama3").
      model: the model name the agent's client is told to use (informational).
      outcomes: exceptions (classes, or qualified class names) that end an episode with the
        given status instead of ENV_ERROR, added to `AGENT_OUTCOMES` (a status of None removes
        a default).
      roles: several agents in one episode (e.g. ("solver", "verifier")): each role gets a
        session of its own (its own base URL, `.../s/{session}/v1`, so its calls are its own
        token stream), `run` gets a mapping role -> `openai.AsyncOpenAI` (a `command`, the
        JSON `AGENTAX_ROLES` = {role: {"base_url", "api_key"}}), and the episode yields one
        trajectory per trained role, grouped per (task, role) as the collector's own
        multi-agent episodes. Every role samples from the trained policy; `run` may return
        {role: Reward(x)}, a role's agent may POST its own reward. Limits are per role.
      trained_roles: the roles whose trajectories train (default: all of `roles`).
    """

    reset_timeout_s = None
    step_timeout_s = None

    def __init__(self, run: AgentFn | None = None, *, command: Sequence[str] | None = None,
                 reward_fn: Callable[[Task, str], Any] | None = None, tool_format: str = "hermes",
                 model: str = "agentax",
                 outcomes: Mapping[type[BaseException] | str, TrajectoryStatus | None] | None = None,
                 roles: Sequence[str] = (), trained_roles: Sequence[str] | None = None,
                 ) -> None:
        super().__init__()
        if (run is None) == (command is None):
            raise ValueError("OpenAIAgentEnvironment needs exactly one of run=async fn or command=[argv]")
        self.roles = tuple(str(r) for r in roles)
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"OpenAIAgentEnvironment roles must be distinct, got {self.roles}")
        self.trained_roles = self.roles if trained_roles is None else tuple(trained_roles)
        unknown = set(self.trained_roles) - set(self.roles)
        if unknown or (self.roles and not self.trained_roles):
            raise ValueError(f"trained_roles={list(self.trained_roles)} must name at least one "
                             f"of roles={list(self.roles)}")
        if run is not None and not asyncio.iscoroutinefunction(run):
            raise TypeError("run must be an async function: async def run(client, task)")
        self.run_fn, self.command = run, list(command) if command else None
        self.reward_fn, self.tool_format, self.model = reward_fn, tool_format, model
        merged: dict[str, TrajectoryStatus | None] = dict(AGENT_OUTCOMES)
        for key, status in (outcomes or {}).items():
            merged[key if isinstance(key, str) else f"{key.__module__}.{key.__qualname__}"] = status
        self.outcomes = {k: TrajectoryStatus(v) for k, v in merged.items() if v is not None}

    def outcome_of(self, error: BaseException) -> TrajectoryStatus | None:
        """The status `error` ends an episode with when it is an outcome (None: a failure)."""
        for cls in type(error).__mro__:
            status = self.outcomes.get(f"{cls.__module__}.{cls.__qualname__}")
            if status is not None:
                return status
        return None

    async def _reset(self, task: Task) -> str:
        raise RuntimeError("OpenAIAgentEnvironment drives its own episode: run it through "
                           "agentax.rollout.Collector (env_factory), not reset/step")

    async def _step(self, action: Action) -> StepResult:
        raise RuntimeError("OpenAIAgentEnvironment drives its own episode; see reset()")

    async def drive_episode(self, engine: Any, tokenizer: Any, task: Task, *,
                            sampling: SamplingParams, config: Any,
                            template_kwargs: Mapping[str, Any] | None = None
                            ) -> Trajectory | tuple[Trajectory, ...]:
        """Runs the agent against fresh sessions; never raises except on cancellation.

        One session (one trajectory) per role: with `roles`, the trajectories of the trained
        roles, in `roles` order, each with `info["role"]`; without, the one trajectory.

        Args:
          engine / tokenizer: the run's engine and tokenizer.
          task: the episode's task.
          sampling: the run's sampling with this episode's seed (governs every call).
          config: the collector's `CollectorConfig` (timeouts and budgets, per role).
          template_kwargs: chat-template variables of the run.
        """
        t0 = time.perf_counter()
        server = await shared_server(engine, tokenizer, tool_format=self.tool_format,
                                     template_kwargs=template_kwargs)
        limits = SessionLimits(max_turns=config.max_turns, max_tokens=config.max_episode_tokens,
                               model_timeout_s=config.model_timeout_s)
        names = self.roles or (None,)
        # Role 0 keeps the episode's seed; the others get seeds derived from it.
        sessions = {r: server.open_session(
            limits=limits, role=r, sampling=sampling if i == 0 else dataclasses.replace(
                sampling, seed=_role_seed(sampling.seed or 0, i))) for i, r in enumerate(names)}
        targets = {r: (server.session_url(s), s.id) for r, s in sessions.items()}
        status, reason, info = TrajectoryStatus.OK, "done", {}
        returned = None
        try:
            # asyncio.timeout, as the collector's own episodes (wait_for's inner task could
            # leave an exception never retrieved when the episode is cancelled as it fails)
            async with asyncio.timeout(config.episode_timeout_s):
                returned = await self._run_agent(targets, task, config,
                                                 endpoint=(server.host, server.port))
        except TimeoutError:
            status, reason = TrajectoryStatus.TIMEOUT, "episode_timeout"
        except Exception as e:  # noqa: BLE001 - the agent's own failure is the episode's status
            status, reason = self._raised(
                e, next((s.rejected for s in sessions.values() if s.rejected is not None), None))
            info["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            for session in sessions.values():
                server.close_session(session)
        every = list(sessions.values())
        calls = sum(s.counts["calls"] for s in every)
        too_long = next((s.prompt_too_long for s in every if s.prompt_too_long), None)
        truncated = next((s.truncated for s in every if s.truncated), None)
        if any(s.timed_out for s in every) and status != TrajectoryStatus.TIMEOUT:
            status, reason = TrajectoryStatus.TIMEOUT, "model_timeout"
        elif too_long and not calls:
            # No reply was possible: nothing to train (as the collector's own episodes).
            status, reason = TrajectoryStatus.MODEL_ERROR, "prompt_too_long"
            info["error"] = too_long
        elif truncated and status in (TrajectoryStatus.OK, TrajectoryStatus.ENV_ERROR):
            status, reason = TrajectoryStatus.TRUNCATED, truncated
        if status == TrajectoryStatus.OK and not calls:
            status, reason = TrajectoryStatus.ENV_ERROR, "no_model_call"
        explicit, answer, per_role = None, None, {}
        if isinstance(returned, Reward):
            explicit = returned.value
        elif (self.roles and isinstance(returned, Mapping) and returned
              and all(isinstance(v, Reward) for v in returned.values())):
            per_role = {str(r): v.value for r, v in returned.items()}
        elif returned is not None:
            answer = _answer_text(returned)
            info["final_answer"] = answer
            info["agent_returned"] = f"{type(returned).__name__}: {answer[:500]}"
        out = []
        for role, session in sessions.items():
            if self.roles and role not in self.trained_roles:
                continue
            own, role_status, role_info = 0.0, status, dict(info)
            try:
                if per_role or explicit is not None:
                    own = per_role.get(role, 0.0) if per_role else explicit
                elif session.reward is not None:
                    own = session.reward
                elif self.reward_fn is not None and status in (TrajectoryStatus.OK,
                                                               TrajectoryStatus.TRUNCATED):
                    own = await compute_reward(
                        self.reward_fn, task, session.final_answer if answer is None else answer,
                        timeout_s=config.reward_timeout_s)
                elif answer is not None:
                    self._warn_unscored(returned, answer)
            except Exception as e:  # noqa: BLE001 - a bad reward is a typed status, not a crash
                role_status, role_info["reason"] = TrajectoryStatus.REWARD_ERROR, "reward_error"
                role_info["error"] = f"{type(e).__name__}: {e}"[:500]
            role_info = {"reason": reason, "turns": session.counts["calls"], **role_info}
            if role is not None:
                role_info.update(role=role, roles=list(names), episode_turns=calls)
            out.append(session.trajectory(own, role_status, task_id=task.id, info=role_info,
                                          timings={"agent_s": time.perf_counter() - t0}))
        return tuple(out) if self.roles else out[0]

    def agent_name(self) -> str:
        """The agent, as a person would look it up: `module.function` or the command line."""
        if self.run_fn is not None:
            fn = self.run_fn
            return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        return " ".join(self.command or ())

    def _warn_unscored(self, returned: Any, answer: str) -> None:
        """One line per agent (per process) when `run` returned a value that nothing scores."""
        name = self.agent_name()
        if name in _WARNED_AGENTS:
            return
        _WARNED_AGENTS.add(name)
        log.warning(
            "agent %s returned %s %r, which agentax keeps as the episode's final answer, not as a "
            "reward: pass reward_fn=(task, final_answer) -> float to OpenAIAgentEnvironment to score "
            "it, or return agentax.serve.Reward(x); this episode's reward is 0 (plus the run's own "
            "reward function, if it has one)", name, type(returned).__name__, answer[:80])

    def _raised(self, error: BaseException, rejected: str | None) -> tuple[TrajectoryStatus, str]:
        """(status, reason) of an episode whose agent raised `error`."""
        status = self.outcome_of(error)
        if status is not None:
            return status, type(error).__name__
        if rejected is not None:  # the endpoint's 400 for the model's reply, propagated
            return TrajectoryStatus.OK, f"reply_rejected:{rejected}"
        return TrajectoryStatus.ENV_ERROR, "agent_error"

    async def _run_agent(self, targets: Mapping[str | None, tuple[str, str]], task: Task,
                         config: Any, endpoint: tuple[str, int] | None = None) -> Any:
        """Runs the agent; `targets`: role (None without roles) -> (base URL, API key)."""
        if self.run_fn is not None:
            shared = _shared_client_state()
            clients = {r: shared.client(url, key, config.model_timeout_s, endpoint=endpoint)
                       for r, (url, key) in targets.items()}
            try:
                return await self.run_fn(clients if self.roles else clients[None], task)
            finally:
                for client in clients.values():
                    shared.learn(client)
        url, key = next(iter(targets.values()))
        env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": key,
               "AGENTAX_TASK": json.dumps({"id": task.id, "prompt": task.prompt, "answer": task.answer,
                                           "meta": dict(task.meta)}, default=str)}
        if self.roles:
            env["AGENTAX_ROLES"] = json.dumps({r: {"base_url": u, "api_key": k}
                                               for r, (u, k) in targets.items()})
        proc = await asyncio.create_subprocess_exec(*self.command, env=env,
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            _, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
            raise RuntimeError(f"agent program exited with {proc.returncode}: {' '.join(tail)}")
        return None
