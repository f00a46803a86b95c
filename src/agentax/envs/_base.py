"""The `Environment` base class: async reset/step/close with step limits and per-call timeouts.

A concrete environment writes only its interaction logic, `_reset(task)` and `_step(action)`.
The public `reset` / `step` / `close` wrap them and guarantee, for the collector:

* every call is bounded by a timeout (`reset_timeout_s`, `step_timeout_s`, `close_timeout_s`);
* a call that times out, raises, or returns the wrong type ends as an `EnvError` that carries
  the `TrajectoryStatus` to record (TIMEOUT or ENV_ERROR) and a short `kind`, and is counted
  in `stats` — nothing else escapes from `reset` / `step`;
* `max_steps` ends the episode with `done=True, truncated=True`;
* after a failure the environment is marked broken: further steps raise `EnvError` at once.

The collector records ENV_RESET / ENV_STEP spans around these calls; environments record the
TOOL_CALL and REWARD spans inside them (on the caller's current track).

Synchronous environments (plain `reset` / `step` methods) are adapted by `ensure_async_env`,
which runs them on the bounded "env" stage pool (`agentax._executors`): daemon threads, so a
step abandoned after its timeout never keeps the process from exiting, and a pool of its own,
so hung environment calls never starve tools or rewards.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import inspect
import math
from collections.abc import Mapping
from typing import Any

from agentax._aio import CancelIgnored, bounded
from agentax._executors import StageExhausted, stage_executor
from agentax.records import Action, Observation, StepResult, Task, TrajectoryStatus

__all__ = ["Environment", "EnvError", "ensure_async_env"]

_STAT_KEYS = ("resets", "steps", "truncations", "timeouts", "errors", "bad_returns")


class EnvError(Exception):
    """An environment call failed; the episode is over and `status` says how to record it.

    Attributes:
      status: `TrajectoryStatus.TIMEOUT` for a timed-out call, `ENV_ERROR` otherwise
        (or `REWARD_ERROR` when a reward function failed inside the environment).
      kind: short reason: "timeout", "exception", "bad_return", "broken", "reward_error".
      call: "reset", "step" or "close".
    """

    def __init__(self, message: str, *, status: TrajectoryStatus, kind: str, call: str) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind
        self.call = call

    def __repr__(self) -> str:
        return f"EnvError({self.message!r}, status={self.status.value}, kind={self.kind!r}, call={self.call!r})"


class Environment(abc.ABC):
    """Base class of every agentax environment.

    Subclasses implement `async _reset(task) -> Observation | str` and
    `async _step(action) -> StepResult`, and optionally `async _close()`. Limits are class
    attributes that the constructor (or a subclass) may override:

    Attributes:
      max_steps: episode length limit; None for no limit.
      reset_timeout_s / step_timeout_s / close_timeout_s: per-call wall-clock limits
        (None disables a limit; keep them on for anything that talks to the outside world).
    """

    max_steps: int | None = None
    reset_timeout_s: float | None = 60.0
    step_timeout_s: float | None = 60.0
    close_timeout_s: float | None = 10.0

    def __init__(
        self,
        *,
        max_steps: int | None = None,
        reset_timeout_s: float | None = None,
        step_timeout_s: float | None = None,
        close_timeout_s: float | None = None,
    ) -> None:
        if max_steps is not None:
            if max_steps < 1:
                raise ValueError(f"max_steps must be >= 1 (or None for no limit), got {max_steps}")
            self.max_steps = max_steps
        for name, value in (
            ("reset_timeout_s", reset_timeout_s),
            ("step_timeout_s", step_timeout_s),
            ("close_timeout_s", close_timeout_s),
        ):
            if value is not None:
                if value <= 0:
                    raise ValueError(f"{name} must be > 0 seconds, got {value}")
                setattr(self, name, value)

    # ------------------------------------------------------------------ to implement

    @abc.abstractmethod
    async def _reset(self, task: Task) -> Observation | str:
        """Start an episode for `task`; return the first observation (a str is wrapped)."""

    @abc.abstractmethod
    async def _step(self, action: Action) -> StepResult:
        """Apply `action`; return what the agent sees next, the reward, and whether it is done."""

    async def _close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (sandboxes, processes). Default: nothing."""

    # ------------------------------------------------------------------ state

    def _state(self) -> dict[str, Any]:
        # Created lazily so a subclass that forgets super().__init__() still works.
        st = self.__dict__.get("_agentax_state")
        if st is None:
            st = {"task": None, "step": 0, "done": False, "broken": None, "stats": dict.fromkeys(_STAT_KEYS, 0)}
            self.__dict__["_agentax_state"] = st
        return st

    @property
    def task(self) -> Task | None:
        """The task of the current episode (None before the first reset)."""
        return self._state()["task"]

    @property
    def num_steps(self) -> int:
        """Steps taken in the current episode."""
        return self._state()["step"]

    @property
    def stats(self) -> Mapping[str, int]:
        """Counters over this environment's lifetime: resets, steps, truncations, timeouts,
        errors (exceptions), bad_returns (wrong types)."""
        return dict(self._state()["stats"])

    # ------------------------------------------------------------------ public API

    async def reset(self, task: Task) -> Observation:
        """Start an episode. Raises `EnvError` (only) if the environment fails."""
        if not isinstance(task, Task):
            raise TypeError(f"reset() takes an agentax Task, got {type(task).__name__}")
        st = self._state()
        st.update(task=task, step=0, done=False, broken=None)
        st["stats"]["resets"] += 1
        out = await self._guarded("reset", self._reset(task), self.reset_timeout_s)
        if isinstance(out, str):
            out = Observation(content=out)
        if not isinstance(out, Observation):
            raise self._fail("reset", "bad_return", f"_reset returned {type(out).__name__}; expected Observation or str")
        return out

    def _step_state(self, action: Action) -> dict:
        """The episode's state, once `action` may be stepped: an Action, after reset, not broken."""
        if not isinstance(action, Action):
            raise TypeError(f"step() takes an agentax Action, got {type(action).__name__}")
        st = self._state()
        if st["task"] is None:
            raise RuntimeError("step() called before reset(); call `await env.reset(task)` first")
        if st["broken"] is not None:
            raise EnvError(
                f"environment is broken after an earlier failure ({st['broken']}); reset it",
                status=TrajectoryStatus.ENV_ERROR,
                kind="broken",
                call="step",
            )
        return st

    async def step(self, action: Action) -> StepResult:
        """Take one step. Raises `EnvError` (only) if the environment fails.

        Returns a `StepResult`; `done` is True whenever the episode is over and `truncated`
        is True when it ended by `max_steps` (or a limit the environment reports).
        """
        st = self._step_state(action)
        if st["done"]:
            raise RuntimeError("step() called after the episode ended (done=True); reset() first")
        st["step"] += 1
        st["stats"]["steps"] += 1
        out = await self._guarded("step", self._step(action), self.step_timeout_s)
        if not isinstance(out, StepResult):
            raise self._fail("step", "bad_return", f"_step returned {type(out).__name__}; expected StepResult")
        if not isinstance(out.observation, Observation):
            raise self._fail(
                "step", "bad_return", f"StepResult.observation is {type(out.observation).__name__}; expected Observation"
            )
        try:
            reward = float(out.reward)
        except (TypeError, ValueError):
            reward = math.nan
        if not math.isfinite(reward):
            raise self._fail("step", "bad_return", f"StepResult.reward must be a finite number, got {out.reward!r}")
        done, truncated = bool(out.done), bool(out.truncated)
        if not (done or truncated) and self.max_steps is not None and st["step"] >= self.max_steps:
            truncated = True
            out = StepResult(
                observation=out.observation,
                reward=reward,
                done=True,
                truncated=True,
                info={**out.info, "truncated_by": "max_steps"},
            )
        elif reward != out.reward or done != out.done or truncated != out.truncated or (truncated and not done):
            out = StepResult(
                observation=out.observation, reward=reward, done=done or truncated, truncated=truncated, info=out.info
            )
        if truncated:
            st["stats"]["truncations"] += 1
        st["done"] = out.done
        return out

    async def close(self) -> None:
        """Release resources. Never raises; a failure is counted in `stats`."""
        try:
            await self._guarded("close", self._close(), self.close_timeout_s)
        except EnvError:
            pass

    async def __aenter__(self) -> Environment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ helpers

    def _fail(self, call: str, kind: str, message: str, status: TrajectoryStatus = TrajectoryStatus.ENV_ERROR) -> EnvError:
        st = self._state()
        key = {"timeout": "timeouts", "bad_return": "bad_returns"}.get(kind, "errors")
        st["stats"][key] += 1
        if call != "close":
            st["broken"] = kind
        return EnvError(f"{self._label()}.{call}: {message}", status=status, kind=kind, call=call)

    def _label(self) -> str:
        """How failures name this environment."""
        return type(getattr(self, "inner", self)).__name__  # a sync environment's own name

    async def _guarded(self, call: str, coro: Any, timeout_s: float | None) -> Any:
        try:
            if not inspect.isawaitable(coro):
                raise TypeError(f"_{call} must be `async def` (it returned {type(coro).__name__})")
            # A task of its own, abandoned if it ignores the cancellation at the deadline (an
            # environment that swallows CancelledError would otherwise hang its episode).
            return await bounded(coro, timeout_s)
        except EnvError as e:
            # A subclass (or a reward inside it) reported a typed failure itself.
            st = self._state()
            st["stats"]["timeouts" if e.status is TrajectoryStatus.TIMEOUT else "errors"] += 1
            if call != "close":
                st["broken"] = e.kind
            raise
        except CancelIgnored as e:
            raise self._fail(call, "timeout", str(e), TrajectoryStatus.TIMEOUT) from None
        except StageExhausted as e:
            # No thread left because earlier calls hang: counted as the hung call's timeout
            # (the cause), not as a failure of this call.
            raise self._fail(e.call or call, "timeout", str(e), TrajectoryStatus.TIMEOUT) from None
        except TimeoutError:
            raise self._fail(call, "timeout", f"no answer within {timeout_s} s", TrajectoryStatus.TIMEOUT) from None
        except asyncio.CancelledError:
            raise  # the collector cancelled the episode; let it unwind
        except Exception as e:  # noqa: BLE001 - any user-code failure becomes a typed outcome
            raise self._fail(call, "exception", f"raised {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------- sync adapter


class _SyncEnvAdapter(Environment):
    """Runs a synchronous environment (plain `reset` / `step` / optional `close`) on a thread.

    Calls go to the shared, bounded "env" stage pool. A step that hangs past its timeout keeps
    one (daemon) thread of that pool busy and marks the environment broken; it never blocks
    the event loop, the tool or reward pools, or process exit.
    """

    def __init__(self, env: Any, **limits: Any) -> None:
        super().__init__(**{k: v for k, v in limits.items() if v is not None})
        for name in ("max_steps", "reset_timeout_s", "step_timeout_s", "close_timeout_s"):
            if limits.get(name) is None and hasattr(env, name) and not callable(getattr(env, name)):
                value = getattr(env, name)
                if value is not None:
                    setattr(self, name, value)
        self.inner = env
        self._last: concurrent.futures.Future | None = None

    def _run(self, fn: Any, *args: Any) -> asyncio.Future:
        self._last = stage_executor("env").submit(fn, *args)
        return asyncio.wrap_future(self._last)

    async def _reset(self, task: Task) -> Observation | str:
        return await self._run(self.inner.reset, task)

    async def _step(self, action: Action) -> StepResult:
        return await self._run(self.inner.step, action)

    async def _close(self) -> None:
        close = getattr(self.inner, "close", None)
        # After a hung call the inner environment is still busy on its thread: leave it be.
        if callable(close) and (self._last is None or self._last.done()):
            await self._run(close)

    def __repr__(self) -> str:
        return f"ensure_async_env({self.inner!r})"


def ensure_async_env(
    env: Any,
    *,
    max_steps: int | None = None,
    reset_timeout_s: float | None = None,
    step_timeout_s: float | None = None,
) -> Environment:
    """Return `env` as an `Environment`.

    An `Environment` is returned unchanged. Any other object with `reset(task)` and
    `step(action)` methods is wrapped: async methods are awaited, synchronous ones run on the
    "env" stage thread pool. Limits given here override the object's attributes of the same name.

    Raises:
      TypeError: `env` has no `reset` / `step` methods.
    """
    if isinstance(env, Environment):
        return env
    missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
    if missing:
        raise TypeError(
            f"{type(env).__name__} is not an environment: it lacks {', '.join(missing)}(). "
            "Subclass agentax.envs.Environment or give it reset(task) and step(action) methods."
        )
    limits = {"max_steps": max_steps, "reset_timeout_s": reset_timeout_s, "step_timeout_s": step_timeout_s}
    if inspect.iscoroutinefunction(env.reset) and inspect.iscoroutinefunction(env.step):
        return _AsyncDuckAdapter(env, **limits)
    return _SyncEnvAdapter(env, **limits)


class _AsyncDuckAdapter(_SyncEnvAdapter):
    """An object with async reset/step that does not subclass Environment."""

    async def _reset(self, task: Task) -> Observation | str:
        return await self.inner.reset(task)

    async def _step(self, action: Action) -> StepResult:
        return await self.inner.step(action)

    async def _close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            # A synchronous close goes to a thread: on the loop, one that blocks would stop
            # every episode, not only its own cleanup.
            out = close() if inspect.iscoroutinefunction(close) else await self._run(close)
            if inspect.isawaitable(out):
                await out
