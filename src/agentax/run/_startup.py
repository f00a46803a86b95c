"""Calls of user code while a run starts, each with a deadline that holds whatever the code does.

Before any compilation a run calls the user's factories once (environment, agent, tasks) and
closes the probe environment. Each of those calls runs on a daemon thread of its own and is
waited for with a deadline: a factory or a `close` that blocks (a sync call), sleeps forever
(an async one) or ignores cancellation is left behind on its thread — daemon, so it never
keeps the process from exiting — and the run stops with `StartupHang`, one line naming the
call, its user code and the setting that bounds it.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["StartupHang", "call_bounded", "close_bounded"]

T = TypeVar("T")


class StartupHang(RuntimeError):
    """A call of user code at start-up did not return within its limit (the run stops, exit 1)."""


def call_bounded(fn: Callable[[], T], *, timeout_s: float, what: str, knob: str) -> T:
    """`fn()` on a daemon thread; its result, or its exception re-raised here.

    A coroutine returned by `fn` is run to its end on that thread's own event loop, within the
    same deadline.

    Args:
      fn: the call (no arguments).
      timeout_s: the deadline in seconds.
      what: the call as the error line names it, e.g. "env.close() of pkg.mod:make_env".
      knob: the setting that bounds it, e.g. "run.startup_timeout_s".

    Raises:
      StartupHang: no answer within `timeout_s` (the call is left running on its thread).
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            out = fn()
            if inspect.iscoroutine(out):
                # A loop of its own, not asyncio.run: that one waits, at its end, for tasks
                # the coroutine left behind, and so inherits their hangs.
                loop = asyncio.new_event_loop()
                try:
                    out = loop.run_until_complete(out)
                finally:
                    loop.close()
            box["result"] = out
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=target, name=f"agentax-startup-{what}", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        raise StartupHang(
            f"{what} did not return within {timeout_s:g} s at start-up (it hangs; left behind "
            f"on its thread): fix what it waits for, or raise {knob} if it is only slow")
    if "error" in box:
        raise box["error"]
    return box["result"]


def close_bounded(env: Any, *, timeout_s: float, what: str, knob: str) -> None:
    """Closes `env` (sync or async `close`, if it has one) within `timeout_s`.

    A `close` that raises is ignored (the probe environment is discarded either way).

    Raises:
      StartupHang: `close` did not return in time.
    """
    close = getattr(env, "close", None)
    if not callable(close):
        return
    try:
        call_bounded(close, timeout_s=timeout_s, what=what, knob=knob)
    except StartupHang:
        raise
    except Exception:  # noqa: BLE001 - the probe is discarded either way
        pass
