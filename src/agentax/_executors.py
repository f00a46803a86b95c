"""Bounded, per-stage thread pools with daemon threads, for blocking user code.

Synchronous environments, tools and rewards are user code that may block or hang. Each stage
runs them on its own pool (`stage_executor("env" | "tool" | "reward")`), so:

* eight hung sync tools fill only the tool pool: an unrelated reward still gets a thread;
* the pools are bounded (`set_stage_threads`), so runaway concurrency cannot spawn threads
  without limit — a call beyond the bound waits for a free thread (and its caller's timeout);
* the worker threads are daemon threads: a call abandoned after its timeout keeps its thread
  busy, but delays the process's exit by at most `EXIT_WAIT_S` (the standard
  `ThreadPoolExecutor` joins its threads at interpreter exit, so one hung call would hang the
  process forever).

Python cannot kill a thread, so an abandoned call runs until it returns on its own; its thread
is counted in `StageExecutor.busy` meanwhile.

At interpreter exit, calls still running get up to `EXIT_WAIT_S` to return. A daemon thread
that is inside native code (a jitted JAX step of a JAX environment or reward model) when the
interpreter finalizes aborts the whole process (SIGABRT, "terminate called ... exception not
rethrown") — after a run that succeeded. A call still running after the wait is named in a
warning, and the process exits without it.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import logging
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["STAGES", "StageExecutor", "lower_thread_priority", "set_stage_threads",
           "stage_executor"]

STAGES = ("env", "tool", "reward")
_DEFAULT_THREADS = {"env": 32, "tool": 32, "reward": 16}
EXIT_WAIT_S = 5.0

log = logging.getLogger(__name__)
_ALL: weakref.WeakSet = weakref.WeakSet()  # every executor that started a thread


def lower_thread_priority() -> None:
    """Gives the calling thread the lowest CPU priority (nice 19), for background compilation:
    beside an SFT warm start it takes the cycles SFT leaves idle instead of half the cores
    (docs/training.md has the effect on the demo). Linux only, where a
    thread has a nice value of its own (elsewhere a no-op); without privileges it cannot be
    undone, so call it on a thread of its own."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:  # e.g. a sandbox that forbids it: compile at normal priority
            pass


def _wait_for_running_calls() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        # Calls abandoned past their timeout are known to hang: not waited for.
        busy = {ex.name: ex.busy - ex.hung for ex in list(_ALL) if ex.busy > ex.hung}
        if not busy:
            return
        time.sleep(0.01)
    log.warning("exiting with calls still running on stage threads after %g s (%s); if one "
                "is inside native code the process may abort", EXIT_WAIT_S,
                ", ".join(f"{k} {v}" for k, v in busy.items()))


def _watch_at_exit(executor: StageExecutor) -> None:
    _ALL.add(executor)
    # Re-registered at each thread start so that it runs before the exit hooks of libraries
    # imported since (atexit runs last-registered first): jax's hook clears its backends.
    atexit.unregister(_wait_for_running_calls)
    atexit.register(_wait_for_running_calls)


class StageExhausted(RuntimeError):
    """No thread is left: `max_workers` calls of the stage hang past their caller's timeout.

    Attributes:
      call: the hung function's name (e.g. "step"): the cause of this failure.
    """

    def __init__(self, message: str, call: str = ""):
        super().__init__(message)
        self.call = call


def _call_name(fn: Callable[..., Any]) -> str:
    fn = getattr(fn, "func", fn)  # functools.partial
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", type(fn).__name__)
    return f"{type(owner).__name__}.{name}" if owner is not None else name


class _StageFuture(concurrent.futures.Future):
    """A future whose `cancel()` while it runs (its caller's timeout gave up on the call) tells
    the executor that the call's thread is lost until the call returns."""

    def __init__(self, executor: StageExecutor, name: str):
        super().__init__()
        self._executor, self.call_name = executor, name
        self.abandoned = False

    def cancel(self) -> bool:
        if super().cancel():
            return True
        if self.running():
            self._executor._abandon(self)
        return False


class StageExecutor(concurrent.futures.Executor):
    """A thread pool of `max_workers` daemon threads doing live work, started on demand.

    A call whose caller gave up on it (cancelled its future while it runs: a timeout) is
    *abandoned*: its thread is replaced, so hung calls do not starve the stage, up to
    `max_workers` abandoned calls at once. Past that bound a call that finds no idle thread
    fails at once with `StageExhausted`, which names the hung call (the cause), instead of
    timing out in the queue with a reason of its own.

    Args:
      name: the stage (thread names are `agentax-<name>-<i>`).
      max_workers: the bound on threads doing live work (>= 1).
    """

    def __init__(self, name: str, max_workers: int):
        if max_workers < 1:
            raise ValueError(f"{name} executor needs max_workers >= 1, got {max_workers}")
        self.name = name
        self.max_workers = max_workers
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for work
        self._pending = 0  # submitted items no thread has taken yet
        self._generation = 0  # bumped by shutdown: older threads stop counting
        self._hung: dict[_StageFuture, None] = {}  # abandoned calls still running
        self.busy = 0
        """Calls running now (an abandoned hung call stays counted until it returns)."""
        self.abandoned_total = 0
        """Calls abandoned past their caller's timeout over the pool's life."""

    @property
    def hung(self) -> int:
        """Abandoned calls still running (each holds a thread)."""
        return len(self._hung)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future = _StageFuture(self, _call_name(fn))
        with self._lock:
            if len(self._hung) >= self.max_workers and self._idle <= self._pending:
                raise self._exhausted()
            self._pending += 1
            self._grow()
            self._work.put((future, fn, args, kwargs))
        return future

    def _grow(self) -> None:
        """Starts a thread if work waits and live threads are under the bound (lock held)."""
        live = len(self._threads) - len(self._hung)
        if self._pending > self._idle and live < self.max_workers:
            thread = threading.Thread(
                target=self._worker, args=(self._work, self._generation),
                name=f"agentax-{self.name}-{len(self._threads)}", daemon=True,
            )
            self._threads.append(thread)
            self._idle += 1
            _watch_at_exit(self)
            thread.start()

    def _abandon(self, future: _StageFuture) -> None:
        with self._lock:
            if future.abandoned or future.done():
                return
            future.abandoned = True
            self._hung[future] = None
            self.abandoned_total += 1
            self._grow()  # a queued call gets the lost thread's place

    def _exhausted(self) -> StageExhausted:
        names = collections.Counter(f.call_name for f in self._hung)
        name, count = names.most_common(1)[0]
        return StageExhausted(
            f"no {self.name} thread left: {len(self._hung)} calls hang past their timeout "
            f"(e.g. {name} x{count}); fix what they wait for", call=name.rsplit(".", 1)[-1])

    def _worker(self, work: queue.SimpleQueue, generation: int) -> None:
        while True:
            item = work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            with self._lock:
                current = generation == self._generation
                if current:
                    self._pending -= 1
                    self._idle -= 1
                self.busy += 1
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._lock:
                    self.busy -= 1
                    self._hung.pop(future, None)
                    if generation == self._generation:
                        self._idle += 1
                del item, future, fn, args, kwargs

    @property
    def threads(self) -> int:
        """Threads started (and not shut down)."""
        return len(self._threads)

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        """Lets every thread exit once its current call returns (never waits for a hung one).

        Queued calls are cancelled. The executor stays usable: a later `submit` starts fresh
        threads. The shared stage pools are never shut down; a private pool (one
        environment's own thread) is, when its owner closes.
        """
        with self._lock:
            old, threads = self._work, self._threads
            self._work, self._threads = queue.SimpleQueue(), []
            self._generation += 1
            self._idle = self._pending = 0
            self._hung.clear()  # their threads are no longer this pool's
        if cancel_futures:
            while True:
                try:
                    item = old.get_nowait()
                except queue.Empty:
                    break
                item[0].cancel()
        for _ in threads:
            old.put(None)
        if wait:
            for t in threads:
                if t is not threading.current_thread():
                    t.join()


_pools: dict[str, StageExecutor] = {}
_sizes = dict(_DEFAULT_THREADS)
_pools_lock = threading.Lock()


def stage_executor(stage: str) -> StageExecutor:
    """The shared pool of one stage ("env", "tool" or "reward")."""
    pool = _pools.get(stage)
    if pool is None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; choose from {list(STAGES)}")
        with _pools_lock:
            pool = _pools.get(stage)
            if pool is None:
                pool = _pools[stage] = StageExecutor(stage, _sizes[stage])
    return pool


def set_stage_threads(**sizes: int) -> None:
    """Sets the thread bound of stages, e.g. `set_stage_threads(env=64, tool=16)`.

    A bound can grow at any time; a pool that already started more threads than a smaller new
    bound keeps them (threads cannot be stopped) but starts no new one.
    """
    for stage, n in sizes.items():
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; choose from {list(STAGES)}")
        if int(n) < 1:
            raise ValueError(f"{stage} threads must be >= 1, got {n}")
        with _pools_lock:
            _sizes[stage] = int(n)
            if stage in _pools:
                _pools[stage].max_workers = int(n)
