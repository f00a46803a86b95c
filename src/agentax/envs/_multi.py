"""`MultiAgentEnvironment`: one episode, several agents (roles) taking turns.

A multi-agent environment names its roles (`roles`), says whose turn it is, takes that role's
action and answers with a `RoleStep`: the observations each role sees now, the rewards each role
earned, whether the episode is over, and the role that acts next. The base class adds what
`Environment` adds to a single-agent environment: per-call timeouts, typed failures
(`EnvError`), a step limit, and checks of what `_reset` / `_step` return.

    class TicTacToe(MultiAgentEnvironment):
        roles = ("x", "o")

        async def _reset(self, task):
            return RoleStep(observations={"x": Observation(content=board)}, next_role="x")

        async def _step(self, role, action):
            ...
            return RoleStep(observations={"o": Observation(content=board)},
                            rewards={"x": 0.0}, next_role="o")

The collector runs it in its one episode loop (a single-agent `Environment` is the one-role
case of the same loop, `as_multi_agent`): each role has its own agent and its own token
stream; which model answers a role is the collector's choice (`agentax.rollout.RolePolicy`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from agentax.envs._base import Environment, ensure_async_env
from agentax.records import Action, Observation, StepResult, Task

__all__ = ["MultiAgentEnvironment", "RoleStep", "as_multi_agent", "SINGLE_ROLE"]

SINGLE_ROLE = "agent"
"""The role name of a single-agent environment run as the one-role case."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoleStep:
    """What a multi-agent environment answers to a reset or a step.

    Attributes:
      observations: role -> what that role sees now (roles not named see nothing new). The
        role that acts next must be among them unless the episode is done.
      rewards: role -> reward earned by this step (missing roles earn 0).
      done: the episode is over.
      truncated: it ended by a limit, not by its own rules.
      next_role: the role whose turn it is (ignored when done).
      info: free-form; `info["metrics"]` (name -> number) reaches every role's trajectory.
    """

    observations: Mapping[str, Observation] = dataclasses.field(default_factory=dict)
    rewards: Mapping[str, float] = dataclasses.field(default_factory=dict)
    done: bool = False
    truncated: bool = False
    next_role: str | None = None
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class MultiAgentEnvironment(Environment):
    """Base class of an environment with several agents (roles) in one episode.

    Subclasses set `roles` and implement `async _reset(task) -> RoleStep` and
    `async _step(role, action) -> RoleStep` (optionally `_close`). `reset(task)` and
    `step(role, action)` wrap them with the limits of `Environment` (`max_steps` counts the
    steps of all roles) and raise only `EnvError`.
    """

    roles: tuple[str, ...] = ()

    async def _reset(self, task: Task) -> RoleStep:  # type: ignore[override]
        raise NotImplementedError

    async def _step(self, role: str, action: Action) -> RoleStep:  # type: ignore[override]
        raise NotImplementedError

    def _check(self, call: str, out: Any, role: str | None = None) -> RoleStep:
        if not isinstance(out, RoleStep):
            raise self._fail(call, "bad_return", f"_{call} returned {type(out).__name__}; expected RoleStep")
        roles = tuple(self.roles)
        for name in (*out.observations, *out.rewards):
            if name not in roles:
                raise self._fail(call, "bad_return", f"unknown role {name!r}; the roles are {list(roles)}")
        for name, obs in out.observations.items():
            if not isinstance(obs, Observation):
                raise self._fail(call, "bad_return",
                                 f"observation of role {name!r} is {type(obs).__name__}; expected Observation")
        rewards = {}
        for name, value in out.rewards.items():
            try:
                rewards[name] = float(value)
            except (TypeError, ValueError):
                rewards[name] = math.nan
            if not math.isfinite(rewards[name]):
                raise self._fail(call, "bad_return", f"reward of role {name!r} must be a finite number, got {value!r}")
        done = bool(out.done or out.truncated)
        st = self._state()
        truncated = bool(out.truncated)
        info = out.info
        if not done and call == "step" and self.max_steps is not None and st["step"] >= self.max_steps:
            done = truncated = True
            info = {**out.info, "truncated_by": "max_steps"}
        if not done:
            if out.next_role not in roles:
                raise self._fail(call, "bad_return",
                                 f"next_role={out.next_role!r} is not one of the roles {list(roles)}")
            if out.next_role not in out.observations:
                raise self._fail(call, "bad_return",
                                 f"next_role={out.next_role!r} got no observation; give the role that "
                                 "acts next what it sees")
        if truncated:
            st["stats"]["truncations"] += 1
        st["done"] = done
        return dataclasses.replace(out, rewards=rewards, done=done, truncated=truncated, info=info)

    async def reset(self, task: Task) -> RoleStep:  # type: ignore[override]
        """Start an episode: the first observations and the first role to act."""
        if not isinstance(task, Task):
            raise TypeError(f"reset() takes an agentax Task, got {type(task).__name__}")
        if not self.roles:
            raise ValueError(f"{type(self).__name__}.roles is empty; name the roles of the episode")
        st = self._state()
        st.update(task=task, step=0, done=False, broken=None)
        st["stats"]["resets"] += 1
        out = await self._guarded("reset", self._reset(task), self.reset_timeout_s)
        return self._check("reset", out)

    async def step(self, role: str, action: Action) -> RoleStep:  # type: ignore[override]
        """`role` takes `action`; raises `EnvError` (only) if the environment fails."""
        st = self._step_state(action)
        if st["done"]:
            raise RuntimeError("step() called after the episode ended (done=True); reset() first")
        st["step"] += 1
        st["stats"]["steps"] += 1
        out = await self._guarded("step", self._step(role, action), self.step_timeout_s)
        return self._check("step", out, role)


class _OneRole(MultiAgentEnvironment):
    """A single-agent environment as the one-role case: its role is `SINGLE_ROLE`. The inner
    environment enforces its own limits and timeouts; this only relays its answers."""

    roles = (SINGLE_ROLE,)
    single = True

    def __init__(self, env: Environment) -> None:
        super().__init__()
        self.inner = env

    async def reset(self, task: Task) -> RoleStep:  # type: ignore[override]
        obs = await self.inner.reset(task)
        return RoleStep(observations={SINGLE_ROLE: obs}, next_role=SINGLE_ROLE)

    async def step(self, role: str, action: Action) -> RoleStep:  # type: ignore[override]
        result: StepResult = await self.inner.step(action)
        return RoleStep(observations={SINGLE_ROLE: result.observation},
                        rewards={SINGLE_ROLE: result.reward}, done=result.done,
                        truncated=result.truncated, next_role=SINGLE_ROLE, info=result.info)

    async def close(self) -> None:
        await self.inner.close()


def as_multi_agent(env: Any) -> MultiAgentEnvironment:
    """`env` as a `MultiAgentEnvironment`: itself if it is one, else (a single-agent
    `Environment` or a sync environment) the one-role case with role `SINGLE_ROLE`."""
    if isinstance(env, MultiAgentEnvironment):
        return env
    return _OneRole(ensure_async_env(env))
