"""SIGINT / SIGTERM during `agentax train`: stop at a step boundary, checkpoint, exit 130/143.

The first signal asks the run to stop. Inside the RL loop, a train step that is running (or
has finished but is not yet logged) is finished, logged and checkpointed, then the run
stops; if the trainer is idle (waiting for rollouts, evaluating) the loop is cancelled at
once and in-flight episodes are abandoned (counted as cancelled). Either way the runner then
writes a checkpoint of the last finished step. Outside the loop (start-up, SFT warm start)
the signal abandons the work at once: nothing there is resumable. A second signal exits
immediately without saving.

Signals are honoured whatever the process is doing:

* `Interrupted` is a `BaseException`, so no `except Exception` (user code, a library) can
  swallow it; where it still vanishes (raised inside a callback that XLA turns into an error
  of its own), the flag stays set and `StopGuard.check()` at every phase boundary and SFT
  step raises it again, and `main` reads any error after a signal as the interruption;
* a signal that no one acknowledges within `UNHONOURED_S` (the event loop blocked by user
  code, a hang in native code) ends the process from a watcher thread: one line, the trace
  flushed, exit 128 + N (`hard_exit`);
* a checkpoint being written is finished first (`StopGuard.saving()`): a signal never leaves
  a run without the checkpoint it was writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from typing import Any

__all__ = ["Interrupted", "StopGuard", "hard_exit", "interrupt", "interrupted_by", "received"]

UNHONOURED_S = 10.0
"""A signal nobody acknowledged after this long ends the process (`hard_exit`)."""

_received: list[int] = []  # signals received by this process (a StopGuard's handler)


def received() -> int | None:
    """The first SIGINT / SIGTERM a `StopGuard` received in this process, or None."""
    return _received[0] if _received else None


def interrupt(signum: int, frame: Any) -> None:
    """A signal handler outside a run's `StopGuard`: raises `Interrupted` (a second signal
    exits at once)."""
    if _received:
        os._exit(128 + signum)
    _received.append(signum)
    raise Interrupted(signum)


def hard_exit(code: int, line: str) -> None:
    """Ends the process now: writes `line` to stderr, flushes the trace (bounded), `os._exit`.

    For a process that cannot end the orderly way (its event loop is blocked by user code
    for good): the last checkpoint stays the newest complete one; metrics.jsonl is flushed
    line by line already."""
    try:
        os.write(2, (line.rstrip("\n") + "\n").encode())
    except OSError:
        pass
    try:
        from agentax.trace import get_tracer

        flusher = threading.Thread(target=get_tracer().close, daemon=True)
        flusher.start()
        flusher.join(5.0)
    finally:
        os._exit(code)


def interrupted_by(signum: int) -> str:
    return f"interrupted by {signal.Signals(signum).name}"


class Interrupted(BaseException):
    """The run stopped because of a signal; `exit_code` is 128 + the signal number.

    A `BaseException` (like `KeyboardInterrupt`): `except Exception` must not swallow it."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or interrupted_by(signum))
        self.signum = signum
        self.exit_code = 128 + signum
        self.message = message


class _StopRequested(Exception):
    """Raised inside the RL loop to end it after a signal."""


class StopGuard:
    """Installs the handlers for one `agentax train` and tracks whether a step is in flight.

    Use `with StopGuard() as guard:`; wrap the trainer with `guard.trainer(t)` before giving it
    to the pipeline; call `guard.step_logged()` at the end of every on_step callback; run the
    loop's main coroutine with `guard.enter_loop(task)` / `leave_loop()` around it.
    """

    def __init__(self, command: str = "train") -> None:
        self.command = command
        self.signum: int | None = None
        self.acknowledged = threading.Event()
        self._saving = 0
        self._defer = 0  # inside `deferring()`: a signal waits for the next `check()`
        self._deferred = False  # a signal came during `saving()`
        self._lock = threading.Lock()
        self._busy = False
        self._unlogged = 0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._previous: dict[int, Any] = {}

    # -- installation ---------------------------------------------------------------------
    def __enter__(self) -> "StopGuard":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> bool:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            os.write(2, f"agentax: second {signal.Signals(signum).name}, exiting now "
                        "(nothing saved)\n".encode())
            os._exit(128 + signum)
        self.signum = signum
        _received.append(signum)
        threading.Thread(target=self._watch_unhonoured, name="agentax-signal-watch",
                         daemon=True).start()
        loop = self._loop
        if loop is None or loop.is_closed():
            if self._defer:
                self.acknowledge()  # our own step loop calls check() at the next boundary
                return
            if self._saving:
                self._deferred = True  # `saving()` raises once the checkpoint is complete
                return
            raise Interrupted(signum)
        loop.call_soon_threadsafe(self._on_signal)

    def _watch_unhonoured(self) -> None:
        if self.acknowledged.wait(UNHONOURED_S):
            return
        name = signal.Signals(self.signum).name
        hard_exit(128 + self.signum, f"agentax {self.command}: interrupted by {name}, which was "
                  f"not honoured within {UNHONOURED_S:g} s (the event loop or the main thread is "
                  "blocked, e.g. by user code); exited without a new checkpoint")

    def acknowledge(self) -> None:
        """The signal reached code that stops the run the orderly way."""
        self.acknowledged.set()

    def check(self) -> None:
        """Raises `Interrupted` if a signal came (where an earlier raise may have been lost)."""
        if self.signum is not None and not self._saving:
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def deferring(self):
        """A loop of our own steps (SFT): a signal is raised by the next `check()`, between
        two steps, so the loop can checkpoint a consistent state first."""
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1

    @contextlib.contextmanager
    def saving(self):
        """A checkpoint is being written: a signal waits for it, then interrupts."""
        self._saving += 1
        try:
            yield
        finally:
            self._saving -= 1
        if self._deferred and not self._saving:
            self._deferred = False
            raise Interrupted(self.signum)

    def _on_signal(self) -> None:
        """In the loop thread: cancel now if no step is in flight, else let on_step stop."""
        self.acknowledge()
        with self._lock:
            if self._busy or self._unlogged:
                return
            self._closed = True
        if self._task is not None:
            self._task.cancel()

    # -- the RL loop ----------------------------------------------------------------------
    def enter_loop(self, task: asyncio.Task) -> None:
        if self.signum is not None:  # arrived before the loop (perhaps swallowed): stop now
            raise Interrupted(self.signum)
        self._loop, self._task = asyncio.get_running_loop(), task

    def leave_loop(self) -> None:
        self._loop, self._task = None, None

    def trainer(self, trainer: Any) -> Any:
        return _GuardedTrainer(trainer, self)

    def step_logged(self) -> None:
        """End of on_step: the step is logged (and checkpointed when due); stop if asked."""
        with self._lock:
            self._unlogged = max(self._unlogged - 1, 0)
        if self.signum is not None:
            with self._lock:
                self._closed = True
            raise _StopRequested()

    @staticmethod
    def stopped(exc: BaseException) -> bool:
        """True for the exceptions that end the loop because of a signal."""
        return isinstance(exc, (_StopRequested, asyncio.CancelledError))

    def _begin_step(self) -> None:
        with self._lock:
            if self._closed:
                raise _StopRequested()
            self._busy = True

    def _end_step(self, ok: bool) -> None:
        with self._lock:
            self._busy = False
            self._unlogged += int(ok)


class _GuardedTrainer:
    """The trainer as the pipeline sees it: `step` refuses to start once the run stops."""

    def __init__(self, trainer: Any, guard: StopGuard):
        self._trainer, self._guard = trainer, guard

    def step(self, groups):
        self._guard._begin_step()
        ok = False
        try:
            out = self._trainer.step(groups)
            ok = True
            return out
        finally:
            self._guard._end_step(ok)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)
