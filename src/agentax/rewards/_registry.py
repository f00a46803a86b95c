"""Reward functions: the `Reward` protocol, `call_reward`, `weighted`, and the name registry.

A reward is a callable `(task: Task, response: str) -> float`, sync or async. Callers should go
through `await call_reward(fn, task, response)`, which awaits async rewards and runs sync ones
inline (they are expected to be cheap; heavy sync rewards should be async or use an executor).
A reward that raises signals a broken reward (the collector marks the trajectory
REWARD_ERROR); bad model output is simply a low reward.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Union

from agentax.records import Task

__all__ = ["Reward", "call_reward", "weighted", "register_reward", "get_reward", "reward_names"]

Reward = Callable[[Task, str], Union[float, Awaitable[float]]]
"""(task, response) -> float, or an awaitable of it."""

_REGISTRY: dict[str, Reward] = {}


async def call_reward(fn: Reward, task: Task, response: str) -> float:
    """Calls a sync or async reward and returns a finite float.

    Raises:
        ValueError: the reward returned something that is not a finite number.
    """
    value = fn(task, response)
    if inspect.isawaitable(value):
        value = await value
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"reward {getattr(fn, '__name__', fn)!r} returned {value!r}, not a number") from None
    if not math.isfinite(out):
        raise ValueError(f"reward {getattr(fn, '__name__', fn)!r} returned {out}, not a finite number")
    return out


def weighted(parts: Sequence[tuple[Reward, float]], *, normalize: bool = False) -> Reward:
    """Combines rewards as sum(w_i * r_i) (divided by sum(w_i) when `normalize`).

    The result is async (it may contain async parts); use `call_reward` to call it.
    """
    parts = tuple(parts)
    if not parts:
        raise ValueError("weighted() needs at least one (reward, weight) pair")
    for fn, w in parts:
        if not callable(fn) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise ValueError(f"weighted() expects (callable, finite weight) pairs, got ({fn!r}, {w!r})")
    total = sum(w for _, w in parts)
    if normalize and total == 0:
        raise ValueError("weighted(normalize=True) needs weights that do not sum to 0")

    async def combined(task: Task, response: str) -> float:
        value = 0.0
        for fn, w in parts:
            if w:
                value += w * await call_reward(fn, task, response)
        return value / total if normalize else value

    combined.__name__ = "weighted(" + ", ".join(f"{getattr(f, '__name__', 'reward')}*{w:g}" for f, w in parts) + ")"
    return combined


def register_reward(name: str, fn: Reward, *, overwrite: bool = False) -> Reward:
    """Makes `fn` available as `get_reward(name)` (e.g. from YAML configs). Returns fn."""
    if not callable(fn):
        raise TypeError(f"reward {name!r} must be callable, got {type(fn).__name__}")
    if name in _REGISTRY and not overwrite and _REGISTRY[name] is not fn:
        raise ValueError(f"a reward named {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = fn
    return fn


def get_reward(name: str) -> Reward:
    """The reward registered under `name`; raises KeyError listing the valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown reward {name!r}.{hint} Registered: {', '.join(sorted(_REGISTRY))}") from None


def reward_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))
