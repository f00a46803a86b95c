"""Awaiting user code with a deadline that holds even when the code ignores cancellation.

`asyncio.timeout` (and `asyncio.wait_for`) end a call by cancelling it and then wait for it to
unwind: user code that swallows `CancelledError` (a retry loop around `await ...` with a bare
`except`) turns that wait into forever, and the episode, the group and in the end the run
hang with it. `bounded` runs the call as a task of its own, cancels it at the deadline, gives
it `grace_s` to unwind, and otherwise abandons it (it runs on, detached; its result or error
is retrieved when it ends, so nothing is ever reported as "never retrieved").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["CancelIgnored", "abandon", "abandoned_count", "bounded", "run"]

T = TypeVar("T")
log = logging.getLogger(__name__)

GRACE_S = 1.0
"""How long a cancelled call gets to unwind before it is abandoned."""

_abandoned: set[asyncio.Future] = set()  # strong references: a dropped task may be collected


class CancelIgnored(TimeoutError):
    """The call ran past its deadline and ignored the cancellation (it was abandoned)."""


def abandoned_count() -> int:
    """Calls abandoned by `bounded` that have not ended yet (in this process)."""
    return sum(1 for t in _abandoned if not t.done())


def _retrieve(task: asyncio.Future) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # marks it retrieved; the caller has long moved on


def abandon(task: asyncio.Future) -> None:
    """Leaves `task` running detached; its outcome is retrieved when it ends."""
    _abandoned.add(task)
    task.add_done_callback(_retrieve)


async def bounded(aw: Awaitable[T], timeout_s: float | None, *, grace_s: float = GRACE_S) -> T:
    """`await aw`, raising `TimeoutError` after `timeout_s` seconds (None: no deadline).

    At the deadline the call is cancelled; if it has not ended `grace_s` later it is abandoned
    and `CancelIgnored` (a `TimeoutError`) is raised. When the caller itself is cancelled, the
    call is cancelled too and gets the same grace before the caller's cancellation goes on.
    """
    if timeout_s is None:
        return await aw
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        await _cancel(task, grace_s)
        raise
    if done:
        return task.result()
    if not await _cancel(task, grace_s):
        raise CancelIgnored(f"no answer within {timeout_s:g} s, and it ignored cancellation "
                            f"for {grace_s:g} s (abandoned)")
    raise TimeoutError(f"no answer within {timeout_s:g} s")


async def _cancel(task: asyncio.Future, grace_s: float) -> bool:
    """Cancels `task` and waits up to `grace_s` for it; False (and abandoned) if it goes on."""
    task.cancel()
    try:
        done, _ = await asyncio.wait({task}, timeout=grace_s)
    except asyncio.CancelledError:  # cancelled again while waiting: stop waiting
        abandon(task)
        raise
    if not done:
        abandon(task)
        return False
    _retrieve(task)
    return True



def run(main: Awaitable[T], *, grace_s: float = 15.0) -> T:
    """`asyncio.run(main)`, except that tasks still running at the end get `grace_s` seconds to
    unwind from their cancellation and are then left behind: `asyncio.run` waits for them
    forever, so one environment that swallows `CancelledError` kept a finished or stopped run
    from ever exiting."""
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            left = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in left:
                t.cancel()
            left = [t for t in left if t not in _abandoned]  # they had their grace
            if left:
                _, stuck = loop.run_until_complete(asyncio.wait(left, timeout=grace_s))
                if stuck:
                    log.warning("%d tasks ignored cancellation for %g s; left behind",
                                len(stuck), grace_s)
            for t in left:
                if t.done() and not t.cancelled():
                    t.exception()  # retrieved: the run's own outcome was raised above
            loop.run_until_complete(loop.shutdown_asyncgens())
            for t in asyncio.all_tasks(loop):  # left behind on purpose: no "destroyed but
                t._log_destroy_pending = False  # pending" report for each when collected
                _abandoned.discard(t)
        finally:
            asyncio.set_event_loop(None)
            loop.close()
