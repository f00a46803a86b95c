"""Stopping a run that cannot make progress, with one line that says why and what to change.

Three things stop a run with `RunFailed` (the CLI turns it into a one-line, non-zero exit):

* `FailureBreaker`: of the last `window` finished episodes, a fraction `rate` or more failed
  for the same reason (default: all of the last 64) — an environment whose reset always
  raises, every model call timing out — or an episode failed because the engine died.
* the stall bound: no group reached the trainer within `stall_timeout_s` (the pipeline measures
  it; `describe_stuck` names what the in-flight episodes are waiting in).
* `LoopWatchdog`: the event loop did not run for `limit_s` — synchronous work inside an async
  environment or tool (`time.sleep` in `_step`) freezes every episode and every timeout; the
  watchdog names the code that held the loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from agentax.engine import Engine as EngineLike
from agentax.engine import EngineError
from agentax.envs import Environment
from agentax.records import Trajectory, TrajectoryStatus
from agentax.tools import Tool

__all__ = ["FailureBreaker", "LoopWatchdog", "RunFailed", "describe_stuck"]

log = logging.getLogger(__name__)

_TRAINABLE = (TrajectoryStatus.OK, TrajectoryStatus.TRUNCATED)


class RunFailed(RuntimeError):
    """The pipeline stopped a run that cannot make progress.

    `str(error)` is one line: the cause, a sample error, and the knob to change.

    Attributes:
      cause: short machine-readable cause ("failures", "engine_died", "stalled", "loop_blocked").
      sample_error: one error message from the episodes, if there is one.
      knob: what to change (a config key, or the code to fix).
    """

    def __init__(self, cause: str, message: str, *, sample_error: str = "", knob: str = ""):
        self.cause = cause
        self.sample_error = _one_line(sample_error)
        self.knob = knob
        line = f"run stopped: {message}"
        if self.sample_error:
            line += f"; e.g. {self.sample_error}"
        if knob:
            line += f"; to change: {knob}"
        super().__init__(line)

    def extend(self, text: str) -> None:
        """Appends `; text` to the one-line message (e.g. where the run's checkpoint is)."""
        self.args = (f"{self.args[0]}; {_one_line(text, 400)}",)


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _engine_error_names() -> set[str]:
    """Names of EngineError and its subclasses (the collector records an error's type name)."""
    names, todo = set(), [EngineError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def _knob_for(reason: str) -> str:
    """The config knob (or code) behind a failure reason recorded by the collector."""
    if reason == "prompt_too_long":
        return ("collector.max_episode_tokens (with engine.max_seq_len and trainer.max_seq_len), "
                "or a shorter prompt")
    if reason == "model_timeout":
        return "collector.model_timeout_s, or what slows the engine"
    if reason == "episode_timeout":
        return "collector.episode_timeout_s / collector.model_timeout_s"
    if reason.endswith("_timeout"):
        if reason.startswith("reward"):
            return "collector.reward_timeout_s, or the reward function"
        return "the environment's reset_timeout_s / step_timeout_s, or what it waits for"
    if reason in ("env_factory_error", "agent_factory_error"):
        return (f"fix {reason.split('_')[0]}.factory (it raised when called for an episode, "
                "after passing the start-up check)")
    if reason.startswith(("reset_", "step_", "close_")):
        return "fix the environment"
    if reason.startswith("reward"):
        return "fix the reward function"
    return "fix the cause above"


class FailureBreaker:
    """Watches finished episodes; `record` returns a `RunFailed` once the run should stop.

    Args:
      window: how many of the latest finished episodes are watched (0 disables the breaker;
        engine death still stops the run).
      rate: the run stops when at least this fraction of the window failed for one reason.
    """

    def __init__(self, window: int, rate: float):
        self.window = window
        self.rate = rate
        self._recent: collections.deque[str | None] = collections.deque(maxlen=max(window, 1))
        self._samples: dict[str, tuple[str, str]] = {}  # key -> (sample error, reason)

    def record(self, traj: Trajectory) -> RunFailed | None:
        if traj.status in _TRAINABLE:
            self._recent.append(None)
            return None
        reason = str(traj.info.get("reason", ""))
        error = str(traj.info.get("error", ""))
        if reason in _engine_error_names():
            return RunFailed(
                "engine_died", "the engine failed and cannot serve model calls",
                sample_error=error or reason,
                knob="fix the engine error above (model / engine config); it is not retried",
            )
        if not self.window:
            return None
        key = f"{traj.status.value} ({reason})" if reason else traj.status.value
        self._recent.append(key)
        self._samples[key] = (error or reason, reason)
        if len(self._recent) < self.window:
            return None
        top = collections.Counter(k for k in self._recent if k is not None).most_common(1)
        if not top or top[0][1] < self.rate * self.window:
            return None
        key, count = top[0]
        share = "all" if count == self.window else f"{count}"
        sample, reason = self._samples[key]
        return RunFailed(
            "failures", f"{share} of the last {self.window} episodes failed with {key}",
            sample_error=sample,
            knob=f"{_knob_for(reason)}; or pipeline.breaker_failure_rate (now {self.rate:g}) / "
            f"pipeline.breaker_window (now {self.window})",
        )


# ---------------------------------------------------------------------------- what is stuck


def _owner(frames: list[FrameType]) -> str | None:
    """Names the innermost environment / tool method among `frames` (innermost last)."""
    for frame in reversed(frames):
        owner = frame.f_locals.get("self")
        if isinstance(owner, Environment):
            inner = getattr(owner, "inner", owner)  # a sync environment's adapter
            return f"{type(inner).__name__}.{frame.f_code.co_name.lstrip('_')}"
        if isinstance(owner, Tool):
            return f"tool {owner.name!r}"
        if isinstance(owner, EngineLike) and frame.f_code.co_name == "generate":
            return f"{type(owner).__name__}.generate (a model call)"
    return None


def _culprit(frames: list[FrameType]) -> str | None:
    """An environment / tool method among `frames` (innermost last), else user code."""
    owner = _owner(frames)
    if owner is not None:
        return owner
    for frame in reversed(frames):
        path = frame.f_code.co_filename
        if not _is_library(path):
            return f"{frame.f_code.co_qualname} ({os.path.basename(path)}:{frame.f_lineno})"
    return None


def _is_library(path: str) -> bool:
    agentax_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (path.startswith(agentax_dir) or path.startswith(os.path.dirname(asyncio.__file__))
            or path.startswith(os.path.dirname(threading.__file__)) or path.startswith("<"))


def describe_stuck(tasks: list[asyncio.Task]) -> str:
    """Where the given episode tasks wait now, most common first (e.g. "SlowEnv._step x8")."""
    counts: collections.Counter[str] = collections.Counter()
    for task in tasks:
        if task.done():
            continue
        frames, coro = [], task.get_coro()
        while getattr(coro, "cr_frame", None) is not None and len(frames) < 64:
            frames.append(coro.cr_frame)  # outermost first; cr_await leads inward
            coro = coro.cr_await
        where = _owner(frames)
        if where:
            counts[where] += 1
    return ", ".join(f"{w} x{n}" for w, n in counts.most_common(3))


# ---------------------------------------------------------------------------- loop watchdog


class LoopWatchdog:
    """A thread that notices when the event loop stops running and names what holds it.

    The loop beats every `limit_s / 4`; when a beat is overdue by `limit_s`, the watchdog reads
    the loop thread's stack, logs the culprit at once (the loop may stay blocked for long) and
    schedules `on_block(RunFailed)` on the loop, which runs when the loop is free again.

    If the loop is still blocked `stuck_s` after that, `on_stuck(RunFailed)` is called from the
    watchdog's own thread (once): the loop may never run again (a `time.sleep` that does not
    end), so whoever owns the process decides there (the CLI writes its line, flushes the
    trace and exits). Without `on_stuck`, the block is logged when it is detected.

    Args:
      limit_s: how long the loop may go without running a callback.
      on_block: called on the loop with the `RunFailed` describing the block.
      on_stuck: called from the watchdog thread when the loop stays blocked.
      stuck_s: how long after the report (default: `limit_s`, at least 5 s).
    """

    def __init__(self, limit_s: float, on_block: Callable[[RunFailed], Any], *,
                 on_stuck: Callable[[RunFailed], Any] | None = None,
                 stuck_s: float | None = None):
        self.limit_s = limit_s
        self.on_block = on_block
        self.on_stuck = on_stuck
        self.stuck_s = max(limit_s, 5.0) if stuck_s is None else stuck_s
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="agentax-loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the beat and joins the thread (it wakes at once). Joined, not left to end on
        its own: the thread holds `on_block` (the pipeline and, through it, device arrays), and
        a daemon thread that drops the last reference to a device array while the interpreter
        finalizes aborts the process (SIGABRT in the array's C++ destructor)."""
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def _tick(self) -> None:
        self._beat = time.monotonic()
        if not self._stop.is_set():
            self._handle = self._loop.call_later(self.limit_s / 4, self._tick)

    def _watch(self) -> None:
        reported, stuck_called, first, latest = None, False, None, None
        while not self._stop.wait(min(self.limit_s / 4, 1.0)):
            beat = self._beat
            late = time.monotonic() - beat - self.limit_s / 4
            if reported == beat:
                if (self.on_stuck is not None and not stuck_called
                        and late >= self.limit_s + self.stuck_s):
                    stuck_called = True
                    self.on_stuck(latest)
                continue
            if late < self.limit_s:
                continue
            reported = beat
            frame = sys._current_frames().get(self._loop_thread)
            frames = []
            while frame is not None:
                frames.append(frame)
                frame = frame.f_back
            frames.reverse()  # innermost last
            where = _culprit(frames) or "unknown code"
            error = RunFailed(
                "loop_blocked",
                f"the event loop was blocked for more than {self.limit_s:g} s by {where}; "
                "every episode and timeout stood still",
                knob="make that call non-blocking (await it, or use a sync method, which runs on "
                f"a thread); or pipeline.loop_block_limit_s (now {self.limit_s:g})",
            )
            latest = error
            if first is None:
                first = error
                if self.on_stuck is None:  # else the owner reports it (once, as it stops)
                    log.error("%s", error)
            try:
                self._loop.call_soon_threadsafe(self.on_block, error)
            except RuntimeError:  # the loop is closed
                return
