"""`ProcessEnvironment`: a synchronous environment that runs in a worker process of its own.

A synchronous `reset` / `step` / `close` that hangs cannot be stopped on a thread (Python
cannot kill one): the thread stays busy until the call returns, and a pool of them runs dry
after enough hangs. In a process, a call that outlives its timeout is ended by killing the
process: its memory, threads and file descriptors go with it, and the hang costs only the
episode it hung (`EnvError(TIMEOUT)` through the `Environment` base class, counted like any
other timeout).

Each `ProcessEnvironment` builds its environment in a fresh worker process at its first
call, from an importable factory path and picklable keyword arguments (a YAML config's
`env.factory` / `env.kwargs`), and talks to it over a pipe; tasks, actions and results are
pickled. Workers fork from multiprocessing's fork server, which imports the factory's module
once (`forkserver` preload), so a worker starts in milliseconds without a JAX runtime of its
own; a worker dies with the fork server, which dies with the training process.

What a process cannot share: state held in module globals of the user's code is per episode
(each worker starts from the fork server's copy), and the factory must be importable by path.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from agentax._executors import stage_executor
from agentax.envs._base import Environment
from agentax.records import Action, Observation, StepResult, Task

__all__ = ["ProcessEnvironment"]

_NO_ARG = "__agentax_no_arg__"
_ctx_lock = threading.Lock()
_preloaded: set[str] = set()


_NAME = "agentax-env"


def _without_main(get_preparation_data: Any) -> Any:
    """multiprocessing re-imports the parent's `__main__` in each child (as `__mp_main__`): a
    script without a main guard would run again in every worker. A worker needs only the
    factory's module, so its preparation data leaves `__main__` out."""

    def prepare(name: str) -> dict:
        data = get_preparation_data(name)
        if name.startswith(_NAME):
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    prepare.agentax = True  # type: ignore[attr-defined]
    return prepare


def _context(module: str | None = None) -> Any:
    from multiprocessing import spawn

    ctx = multiprocessing.get_context("forkserver")
    with _ctx_lock:
        if not getattr(spawn.get_preparation_data, "agentax", False):
            spawn.get_preparation_data = _without_main(spawn.get_preparation_data)
        # Only effective before the fork server starts; a later module is imported by each
        # worker itself (slower, still correct).
        if module and module not in _preloaded:
            _preloaded.add(module)
            ctx.set_forkserver_preload([__name__, *sorted(_preloaded)])
    return ctx


def _factory_module(factory: str) -> str:
    return factory.partition(":")[0]


def _noop() -> None:
    os._exit(0)


def _resolve(factory: str) -> Any:
    module, _, qualname = factory.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _die_with_parent() -> None:
    """SIGKILL this worker when its parent (the fork server) dies (Linux; elsewhere the
    worker ends at its pipe's EOF once its call returns)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001 - best effort
            pass


def _worker(conn: Any, factory: str, kwargs: dict, sys_path: list[str]) -> None:
    """The worker process: builds the environment, then answers (method, arg) requests."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    _die_with_parent()
    sys.path[:] = sys_path
    env = None
    try:
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                break
            if request is None:
                break
            method, arg = request
            try:
                if env is None:
                    env = _resolve(factory)(**kwargs)
                fn = getattr(env, method, None)
                if fn is None:  # an environment without close
                    out = None
                else:
                    out = fn() if arg == _NO_ARG else fn(arg)
                    if inspect.iscoroutine(out):
                        out = asyncio.run(out)
                reply = ("ok", out)
                conn.send(reply)
            except BaseException as e:  # noqa: BLE001 - handed to the parent as text
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        # No interpreter shutdown: the fork server's imports (JAX's exit hooks among them)
        # have nothing of this worker's to clean up.
        os._exit(0)


class ProcessEnvironment(Environment):
    """A synchronous environment built and driven in a worker process of its own.

    Args:
      factory: 'package.module:callable' that returns the environment (an object with
        `reset(task)` and `step(action)`, optionally `close()`).
      kwargs: the factory's keyword arguments (picklable).
      max_steps, reset_timeout_s, step_timeout_s, close_timeout_s: the `Environment` limits
        (the first call, `reset`, also covers starting the worker and calling the factory).
    """

    def __init__(self, factory: str, kwargs: Mapping[str, Any] | None = None, **limits: Any):
        super().__init__(**{k: v for k, v in limits.items() if v is not None})
        if ":" not in factory:
            raise ValueError(f"ProcessEnvironment needs a 'package.module:callable' factory, "
                             f"got {factory!r}")
        self.factory = factory
        self.kwargs = dict(kwargs or {})
        self._proc: Any = None
        self._conn: Any = None
        self.exit_code: int | None = None
        """The worker's exit status once it ended (-9: killed after a hung call)."""

    @staticmethod
    def warm_up(factory: str) -> None:
        """Starts the fork server (importing `factory`'s module) in the background, so that
        the first episode does not wait for it to boot."""
        ctx = _context(_factory_module(factory))

        def boot() -> None:
            try:
                ctx.Process(target=_noop, name=_NAME, daemon=True).start()
            except Exception:  # noqa: BLE001 - the first episode tries again and reports it
                pass

        threading.Thread(target=boot, name="agentax-forkserver-boot", daemon=True).start()

    @property
    def pid(self) -> int | None:
        """The worker process's id (None before the first call and after it ended)."""
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        ctx = _context(_factory_module(self.factory))
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_worker, name=f"{_NAME}-{self.factory}",
                           args=(child, self.factory, self.kwargs, list(sys.path)), daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _kill(self) -> None:
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        if proc is not None:
            try:
                proc.kill()
            except (OSError, ValueError):
                pass
            self.exit_code = -signal.SIGKILL
        if conn is not None:
            conn.close()

    async def _call(self, method: str, arg: Any = _NO_ARG) -> Any:
        loop = asyncio.get_running_loop()
        try:
            if self._proc is None:
                if self.exit_code is not None:
                    raise RuntimeError(f"the worker process of {self.factory} has ended")
                # Off the loop: connecting to the fork server waits for it to boot.
                await asyncio.wrap_future(stage_executor("env").submit(self._start))
            conn = self._conn
            reply: asyncio.Future = loop.create_future()

            def readable() -> None:
                loop.remove_reader(conn.fileno())
                if reply.done():
                    return
                try:
                    reply.set_result(conn.recv())
                except (EOFError, OSError):
                    reply.set_exception(RuntimeError(
                        f"the worker process of {self.factory} died during {method}()"))

            try:
                conn.send((method, arg))
            except OSError as e:  # BrokenPipeError: it died (a kill) since its last call
                raise RuntimeError(f"the worker process of {self.factory} died during "
                                   f"{method}()") from e
            loop.add_reader(conn.fileno(), readable)
            try:
                status, out = await reply
            finally:
                if self._conn is conn:
                    loop.remove_reader(conn.fileno())
        except BaseException:
            # A timeout (the base class cancels the call), a cancelled episode or a dead
            # worker: the worker may be inside the call for good, so it goes.
            self._kill()
            raise
        if status == "error":
            raise RuntimeError(out)
        return out

    async def _reset(self, task: Task) -> Observation | str:
        return await self._call("reset", task)

    async def _step(self, action: Action) -> StepResult:
        return await self._call("step", action)

    async def _close(self) -> None:
        if self._proc is None:
            return
        try:
            await self._call("close")
        finally:
            if self._conn is not None:
                try:
                    self._conn.send(None)  # the worker exits at once
                except OSError:
                    pass
                self._conn.close()
                self._proc = self._conn = None
                self.exit_code = 0

    def _label(self) -> str:
        return self.factory

    def __repr__(self) -> str:
        return f"ProcessEnvironment({self.factory!r})"
