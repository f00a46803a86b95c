"""Calling a reward function (sync or async) from an environment, with a timeout.

A reward is a callable `(task, response) -> float` (agentax.rewards contract). Async rewards
are awaited; sync ones run on the bounded "reward" stage pool (daemon threads, not shared with
environments or tools), so a slow verifier never blocks the loop or waits behind a hung tool.
A reward that raises, hangs or returns a non-number ends the episode as REWARD_ERROR.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

from agentax._aio import bounded
from agentax._executors import stage_executor
from agentax.envs._base import EnvError
from agentax.records import Task, TrajectoryStatus
from agentax.trace import get_tracer, names

RewardFn = Callable[[Task, str], Any]


def check_reward_fn(reward_fn: Any) -> RewardFn:
    """Resolve a reward given as a callable or a registered name (agentax.rewards.get_reward)."""
    if isinstance(reward_fn, str):
        from agentax.rewards import get_reward  # resolved lazily: only needed for names

        return get_reward(reward_fn)
    if not callable(reward_fn):
        raise TypeError(f"reward_fn must be a callable (task, response) -> float or a reward name, got {reward_fn!r}")
    return reward_fn


async def compute_reward(reward_fn: RewardFn, task: Task, response: str, *, timeout_s: float | None) -> float:
    """Return `reward_fn(task, response)` as a finite float, or raise EnvError(REWARD_ERROR).

    Records no span itself (callers wrap it: environments use `traced_reward`)."""
    name = getattr(reward_fn, "__name__", type(reward_fn).__name__)
    try:
        if inspect.iscoroutinefunction(reward_fn) or inspect.iscoroutinefunction(getattr(reward_fn, "__call__", None)):
            value = await bounded(reward_fn(task, response), timeout_s)
        else:
            loop = asyncio.get_running_loop()
            value = await bounded(
                loop.run_in_executor(stage_executor("reward"), functools.partial(reward_fn, task, response)), timeout_s
            )
            if inspect.isawaitable(value):
                value = await bounded(value, timeout_s)
    except TimeoutError:
        raise EnvError(
            f"reward {name} gave no answer within {timeout_s} s",
            status=TrajectoryStatus.REWARD_ERROR,
            kind="reward_timeout",
            call="step",
        ) from None
    except Exception as e:  # noqa: BLE001
        raise EnvError(
            f"reward {name} raised {type(e).__name__}: {e}",
            status=TrajectoryStatus.REWARD_ERROR,
            kind="reward_error",
            call="step",
        ) from e
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = math.nan
    if not math.isfinite(out):
        raise EnvError(
            f"reward {name} returned {value!r}; expected a finite number",
            status=TrajectoryStatus.REWARD_ERROR,
            kind="reward_error",
            call="step",
        )
    return out


async def traced_reward(reward_fn: RewardFn, task: Task, response: str, *, timeout_s: float | None) -> float:
    """`compute_reward` inside a REWARD span (for rewards computed inside an environment step)."""
    with get_tracer().span(names.REWARD, args={"reward": getattr(reward_fn, "__name__", "reward")}):
        return await compute_reward(reward_fn, task, response, timeout_s=timeout_s)
