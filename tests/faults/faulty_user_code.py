"""User code that breaks in the ways issue 44 lists, for real `agentax train` processes.

Used as `env.factory=tests.faults.faulty_user_code:<name>` (with `agent.factory=...:agent`
and `tasks.factory=...:tasks`) by tests/faults/test_user_code_faults.py and
benchmarks/faults.py; the child process gets the repository root on its PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import random
import threading
import time

from agentax.recipes.calculator import CalculatorEnvironment, make_agent, make_env
from agentax.recipes.calculator import tasks as tasks  # noqa: PLC0414 - re-exported for configs

_calls = itertools.count()


def agent(**kwargs):
    return make_agent(**kwargs)


def factory_raises(rate: float = 1.0, **kwargs):
    """Passes the start-up check (the first call), then raises for `rate` of the episodes."""
    if next(_calls) > 0 and random.random() < rate:
        raise RuntimeError("injected: the environment factory failed")
    return make_env(**kwargs)


class _SyncHangs:
    """A synchronous environment whose every step hangs for good."""

    step_timeout_s = 0.5

    def __init__(self):
        self.inner = make_env()

    def reset(self, task):
        return asyncio.run(self.inner.reset(task))

    def step(self, action):
        threading.Event().wait()


def sync_step_hangs(**kwargs):
    return _SyncHangs()


class _SwallowsCancel(CalculatorEnvironment):
    step_timeout_s = 0.5

    async def _step(self, action):
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # the bug: cancellation is swallowed


def swallows_cancel(**kwargs):
    return _SwallowsCancel(**kwargs)


class _BlocksTheLoop(CalculatorEnvironment):
    async def _step(self, action):
        marker = os.environ.get("AGENTAX_TEST_BLOCKED_MARKER")
        if marker:  # tells a test the loop is blocked from now on
            open(marker, "a").close()
        time.sleep(3600)  # the bug: a blocking call inside an async method


def blocks_the_loop(**kwargs):
    return _BlocksTheLoop(**kwargs)


class _ConstantReward(CalculatorEnvironment):
    async def _step(self, action):
        result = await super()._step(action)
        return dataclasses.replace(result, reward=0.0, done=True)


def constant_reward(**kwargs):
    """Every episode gets reward 0: every group is dropped by `all_equal_rewards`."""
    return _ConstantReward(**kwargs)


# ------------------------------------------------------------- hangs at start-up and teardown
# (issue 61): `close` that never returns, met by the start-up probe's close.


class _CloseSleeps:
    """An async environment (no Environment subclass) whose close sleeps for good."""

    def __init__(self):
        self.inner = make_env()

    async def reset(self, task):
        return await self.inner.reset(task)

    async def step(self, action):
        return await self.inner.step(action)

    async def close(self):
        await asyncio.sleep(3600)


def close_sleeps(**kwargs):
    return _CloseSleeps()


class _CloseBlocks:
    """A sync environment whose close blocks for good."""

    def __init__(self):
        self.inner = make_env()

    def reset(self, task):
        return asyncio.run(self.inner.reset(task))

    def step(self, action):
        return asyncio.run(self.inner.step(action))

    def close(self):
        threading.Event().wait()


def close_blocks(**kwargs):
    return _CloseBlocks()


class _CloseIgnoresCancel(CalculatorEnvironment):
    """An Environment whose public close swallows cancellation for good."""

    async def close(self):
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # the bug


def close_ignores_cancel(**kwargs):
    return _CloseIgnoresCancel(**kwargs)


def close_hangs_after_probe(**kwargs):
    """Its close returns at start-up (the probe is built on agentax's start-up thread), then
    hangs for good in every episode (sync: in a worker process or on an env thread)."""
    if threading.current_thread().name.startswith("agentax-startup"):
        return _SyncCalculator()
    return _CloseBlocks()


# ----------------------------------------------------------------- occasional sync hangs


class _SyncCalculator:
    """The calculator demo as a synchronous environment."""

    step_timeout_s = 1.0

    def __init__(self, hang_rate: float = 0.0):
        self.inner = make_env()
        self.hang_rate = hang_rate

    def reset(self, task):
        return asyncio.run(self.inner.reset(task))

    def step(self, action):
        if random.random() < self.hang_rate:
            threading.Event().wait()  # hangs for good
        return asyncio.run(self.inner.step(action))


def sync_sometimes_hangs(hang_rate: float = 0.1, **kwargs):
    """A sync environment whose steps hang for good in `hang_rate` of the calls."""
    return _SyncCalculator(hang_rate)


def factory_hangs(**kwargs):
    """The environment factory never returns (met at start-up)."""
    threading.Event().wait()
