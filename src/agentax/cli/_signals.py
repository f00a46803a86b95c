"""SIGINT / SIGTERM during `agentax train`: stop at a step boundary, checkpoint, exit 130/143.

The first signal asks the run to stop. Inside the RL loop, a train step that is running (or
has finished but is not yet logged) is finished, logged and checkpointed, then the run
stops; if the trainer is idle (waiting for rollouts, evaluating) the loop is cancelled at
once and in-flight episodes are abandoned (counted as cancelled). Either way the runner then
writes a checkpoint of the last finished step. Outside the loop (start-up, SFT warm start)
the signal abandons the work at once: nothing there is resumable. A second signal exits
immediately without saving.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

__all__ = ["Interrupted", "StopGuard"]


class Interrupted(Exception):
    """The run stopped because of a signal; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")
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

    def __init__(self) -> None:
        self.signum: int | None = None
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
        loop = self._loop
        if loop is None or loop.is_closed():
            raise Interrupted(signum)
        loop.call_soon_threadsafe(self._on_signal)

    def _on_signal(self) -> None:
        """In the loop thread: cancel now if no step is in flight, else let on_step stop."""
        with self._lock:
            if self._busy or self._unlogged:
                return
            self._closed = True
        if self._task is not None:
            self._task.cancel()

    # -- the RL loop ----------------------------------------------------------------------
    def enter_loop(self, task: asyncio.Task) -> None:
        self._loop, self._task = asyncio.get_running_loop(), task
        if self.signum is not None:  # arrived between the last check and now
            self._on_signal()

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
