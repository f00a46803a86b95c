"""`RayEnvPool`: environments that live in Ray actors, behind the ordinary `Environment` API.

Each environment instance is built inside a Ray actor (placed by resources: `num_cpus`,
custom `resources`, any `ray.remote` option). `pool.factory()` returns a `RemoteEnvironment`,
an `Environment` whose `reset` leases an actor and whose `close` hands it back, so a
`Collector` built with `env_factory=pool.factory` cannot tell it from a local environment:

* **Warm reuse.** Actors are created ahead (`warm=True`, `warm_up()`), and an actor serves
  episode after episode (the next `reset` starts the next episode). Expensive environments
  (sandboxes, simulators, repositories) are built `size` times per run, not once per episode.
* **Timeouts.** The environment inside the actor keeps its own limits (`reset_timeout_s`, ...,
  the `Environment` base class); the proxy bounds every remote call by the same limit plus
  `call_grace_s`, so a hung or unreachable actor ends as `EnvError(TIMEOUT)` like a local one.
* **Failures.** An actor that dies mid-episode (crash, OOM, `ray.kill`, lost node) ends that
  episode with `EnvError(status=ENV_ERROR, kind="actor_died")`; an actor whose call timed out
  is killed (it may still be running the hung call). Either way the pool starts a replacement
  and counts it (`stats()`); the episode is recorded by the collector, never lost. An actor
  that dies during `reset` (before the episode began) is replaced and the reset retried once.

Ray is imported lazily; without it, building a pool raises an error that says
`pip install 'agentax[ray]'`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import threading
from collections.abc import Callable, Mapping
from typing import Any

from agentax.envs import EnvError, Environment
from agentax.records import Action, Observation, StepResult, Task, TrajectoryStatus
from agentax.scale._ray import check_feasible as _check_feasible
from agentax.scale._ray import ensure_ray_initialized, require_ray

__all__ = ["RayEnvPool", "RayEnvPoolStats", "RemoteEnvironment"]

_LIMITS = ("max_steps", "reset_timeout_s", "step_timeout_s", "close_timeout_s")


# ----------------------------------------------------------------------------- the actor


class _EnvActor:
    """Body of the Ray actor: one environment, driven through its async API.

    Typed environment failures come back as values (`("error", status, kind, message)`),
    not as Ray task errors, so the proxy can re-raise the exact `EnvError`.
    """

    def __init__(self, env_factory: Callable[[], Any]) -> None:
        from agentax.envs import ensure_async_env  # noqa: PLC0415 - runs in the actor process

        self.env = ensure_async_env(env_factory())

    async def ready(self) -> dict[str, Any]:
        return {name: getattr(self.env, name, None) for name in _LIMITS}

    async def reset(self, task: Task) -> tuple:
        try:
            return ("ok", await self.env.reset(task))
        except EnvError as e:
            return ("error", e.status.value, e.kind, e.message)

    async def step(self, action: Action) -> tuple:
        try:
            return ("ok", await self.env.step(action))
        except EnvError as e:
            return ("error", e.status.value, e.kind, e.message)

    async def close(self) -> None:
        await self.env.close()

    async def stats(self) -> dict[str, int]:
        return dict(self.env.stats)


_ACTOR_CLASS: Any = None


def _actor_class(ray: Any) -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(_EnvActor)
    return _ACTOR_CLASS


# ----------------------------------------------------------------------------- pool


@dataclasses.dataclass(eq=False)
class _Slot:
    """One actor of the pool and what the pool knows about it."""

    actor: Any
    number: int
    ready_ref: Any
    limits: Mapping[str, Any] | None = None
    dead: bool = False
    """The actor died (crash, kill, lost node); it is replaced."""
    tainted: bool = False
    """A call to it timed out or was abandoned; it is killed and replaced."""
    episodes: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayEnvPoolStats:
    """Counters of a `RayEnvPool` (a snapshot)."""

    size: int
    """Most actors alive at once."""
    live_actors: int
    idle_actors: int
    leased_actors: int
    waiting_episodes: int
    """Episodes waiting for a free actor."""
    actors_started: int
    actors_replaced: int
    """Actors retired after a death or a timeout (a replacement is started for each)."""
    actor_deaths: int
    call_timeouts: int
    """Remote calls that ran past the proxy's own limit (the environment's limit did not fire)."""
    calls_abandoned: int
    """Remote calls given up before they returned (timed out, or the episode was cancelled);
    the actor may still be running them, so it is killed and replaced."""
    start_failures: int
    """Actors whose environment failed to build or did not start in `start_timeout_s`."""
    reset_retries: int
    """Resets retried on a fresh actor after the leased one turned out dead."""
    episodes: int
    """Leases handed out (one per episode)."""


class RayEnvPool:
    """A pool of environments in Ray actors; `factory()` gives `Environment`s that use them.

    Args:
      env_factory: builds one environment (an `Environment` or a sync/async duck-typed env);
        it is pickled (cloudpickle) and called inside each actor.
      size: most actors alive at once (= most concurrent remote episodes; more episodes wait
        for a free actor).
      num_cpus: CPUs Ray reserves per actor (fractions allowed); it decides placement.
      resources: custom Ray resources per actor, e.g. `{"sandbox_host": 1}`.
      actor_options: further `ray.remote` options (`memory`, `runtime_env`, scheduling
        strategy, `max_concurrency`...).
      warm: start all `size` actors now and replace retired ones at once, so environments
        are built before episodes need them; False starts actors on demand.
      reset_timeout_s / step_timeout_s / close_timeout_s: proxy limits per remote call; None
        uses the environment's own limit plus `call_grace_s`.
      call_grace_s: slack over the environment's own limit, so its precise timeout fires first.
      lease_timeout_s: limit on waiting for a free actor (None waits; the collector's
        episode timeout still bounds it).
      start_timeout_s: limit on an actor's start (building its environment).
      check_feasible: refuse at once a request that no live node can ever place (False on an
        autoscaling cluster whose nodes come later).

    Requires a connected Ray cluster (`ray.init(...)` first). Use `shutdown()` (or `with`).
    """

    def __init__(
        self,
        env_factory: Callable[[], Any],
        size: int,
        *,
        num_cpus: float = 1.0,
        resources: Mapping[str, float] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        warm: bool = True,
        reset_timeout_s: float | None = None,
        step_timeout_s: float | None = None,
        close_timeout_s: float | None = None,
        call_grace_s: float = 2.0,
        lease_timeout_s: float | None = None,
        start_timeout_s: float = 300.0,
        check_feasible: bool = True,
    ) -> None:
        if not callable(env_factory):
            raise TypeError(f"env_factory must be a callable returning an environment, got {env_factory!r}")
        if size < 1:
            raise ValueError(f"RayEnvPool size must be >= 1, got {size}")
        if num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {num_cpus}")
        for name, value in (("reset_timeout_s", reset_timeout_s), ("step_timeout_s", step_timeout_s),
                            ("close_timeout_s", close_timeout_s), ("lease_timeout_s", lease_timeout_s)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 seconds (or None), got {value}")
        if call_grace_s < 0 or start_timeout_s <= 0:
            raise ValueError("call_grace_s must be >= 0 and start_timeout_s > 0")
        self._ray = ray = require_ray()
        ensure_ray_initialized(ray)
        self.size = size
        self.warm = warm
        self.call_grace_s = call_grace_s
        self.lease_timeout_s = lease_timeout_s
        self.start_timeout_s = start_timeout_s
        self._timeouts = {"reset_timeout_s": reset_timeout_s, "step_timeout_s": step_timeout_s,
                          "close_timeout_s": close_timeout_s}
        self._options = {"num_cpus": num_cpus, **({"resources": dict(resources)} if resources else {}),
                         **dict(actor_options or {})}
        if check_feasible:
            _check_feasible(ray, self._options, "RayEnvPool")
        self._factory_ref = ray.put(env_factory)
        self._lock = threading.Lock()  # held only for a few list operations, never across an await
        self._idle: collections.deque[_Slot] = collections.deque()
        self._leased: set[_Slot] = set()
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._live = 0
        self._numbers = itertools.count()
        self._counts: collections.Counter = collections.Counter()
        self._closed = False
        if warm:
            with self._lock:
                for _ in range(size):
                    self._idle.append(self._spawn())

    # ------------------------------------------------------------------ public API

    def factory(self) -> RemoteEnvironment:
        """A new `Environment` for one episode; pass `pool.factory` as a collector's env_factory."""
        if self._closed:
            raise RuntimeError("this RayEnvPool is shut down; build a new one")
        return RemoteEnvironment(self)

    def warm_up(self, timeout_s: float | None = None) -> None:
        """Starts all `size` actors (if not yet) and blocks until their environments are built.

        Raises:
          RuntimeError: an actor failed to build its environment (the cause is chained).
        """
        with self._lock:
            while self._live < self.size:
                self._idle.append(self._spawn())
            slots = [s for s in self._idle if s.limits is None]
        if not slots:
            return
        try:
            limits = self._ray.get([s.ready_ref for s in slots], timeout=timeout_s or self.start_timeout_s)
        except Exception as e:
            raise RuntimeError(f"RayEnvPool.warm_up: an environment actor failed to start: {e}") from e
        for slot, lim in zip(slots, limits):
            slot.limits = lim

    def stats(self) -> RayEnvPoolStats:
        c = self._counts
        with self._lock:
            return RayEnvPoolStats(
                size=self.size, live_actors=self._live, idle_actors=len(self._idle),
                leased_actors=len(self._leased), waiting_episodes=len(self._waiters),
                actors_started=c["started"], actors_replaced=c["replaced"], actor_deaths=c["deaths"],
                call_timeouts=c["call_timeouts"], calls_abandoned=c["abandoned"],
                start_failures=c["start_failures"], reset_retries=c["reset_retries"], episodes=c["episodes"],
            )

    def actor_handles(self, *, leased_only: bool = False) -> list[Any]:
        """Ray handles of the live actors (for operations and fault-injection tests)."""
        with self._lock:
            slots = list(self._leased) + ([] if leased_only else list(self._idle))
        return [s.actor for s in slots]

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Closes the idle environments (best effort, bounded) and kills every actor."""
        ray = self._ray
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, leased = list(self._idle), list(self._leased)
            self._idle.clear()
            self._leased.clear()
            waiters = list(self._waiters)
            self._waiters.clear()
        for fut in waiters:
            _settle_threadsafe(fut, exc=_pool_closed_error())
        refs = [s.actor.close.remote() for s in idle if not (s.dead or s.tainted)]
        if refs:
            try:
                ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            except Exception:  # noqa: BLE001 - shutting down; actors are killed next anyway
                pass
        for slot in idle + leased:
            _kill(ray, slot.actor)
        self._live = 0

    def __enter__(self) -> RayEnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ leasing (proxy side)

    def _spawn(self) -> _Slot:
        """Starts one actor (non-blocking). Call with the lock held."""
        actor = _actor_class(self._ray).options(**self._options).remote(self._factory_ref)
        self._live += 1
        self._counts["started"] += 1
        return _Slot(actor=actor, number=next(self._numbers), ready_ref=actor.ready.remote())

    async def _acquire(self) -> _Slot:
        """Leases an actor whose environment is built; raises `EnvError` (only) on failure."""
        waiter = None
        with self._lock:
            if self._closed:
                raise _pool_closed_error()
            if self._idle:
                slot = self._idle.popleft()
            elif self._live < self.size:
                slot = self._spawn()
            else:
                slot = None
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
            if slot is not None:
                self._leased.add(slot)
        if waiter is not None:
            try:
                slot = await asyncio.wait_for(asyncio.shield(waiter), self.lease_timeout_s)
            except (TimeoutError, asyncio.CancelledError) as e:
                with self._lock:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
                if not waiter.cancel() and not waiter.cancelled() and waiter.exception() is None:
                    self._give_back(waiter.result())  # delivered just as we gave up: hand it on
                if isinstance(e, asyncio.CancelledError):
                    raise
                raise EnvError(
                    f"RayEnvPool: no environment actor free within {self.lease_timeout_s} s "
                    f"(size={self.size}); raise the pool size or lease_timeout_s",
                    status=TrajectoryStatus.TIMEOUT, kind="no_actor", call="reset",
                ) from None
        self._counts["episodes"] += 1
        slot.episodes += 1
        if slot.limits is None:
            await self._await_ready(slot)
        return slot

    async def _await_ready(self, slot: _Slot) -> None:
        ray = self._ray
        try:
            slot.limits = await asyncio.wait_for(_as_future(slot.ready_ref), self.start_timeout_s)
        except asyncio.CancelledError:
            self._give_back(slot)  # still starting, not busy: the next lease waits for it
            raise
        except TimeoutError:
            self._counts["start_failures"] += 1
            slot.tainted = True
            self._give_back(slot)
            raise EnvError(
                f"RayEnvPool: an environment actor did not start within {self.start_timeout_s} s "
                "(is the cluster short of the requested resources?)",
                status=TrajectoryStatus.TIMEOUT, kind="actor_start", call="reset",
            ) from None
        except ray.exceptions.RayError as e:
            self._counts["start_failures"] += 1
            slot.dead = True
            self._give_back(slot)
            raise EnvError(
                f"RayEnvPool: the environment actor failed to start: {_short(e)}",
                status=TrajectoryStatus.ENV_ERROR, kind="actor_start", call="reset",
            ) from None

    def _give_back(self, slot: _Slot) -> None:
        """Returns a leased actor: reused if healthy, else killed and replaced."""
        with self._lock:
            self._leased.discard(slot)
            if self._closed:
                _kill(self._ray, slot.actor)
                return
            if slot.dead or slot.tainted:
                self._live -= 1
                self._counts["replaced"] += 1
                _kill(self._ray, slot.actor)
                if not (self.warm or self._waiters):
                    return
                slot = self._spawn()
            if self._waiters:
                waiter = self._waiters.popleft()
                self._leased.add(slot)
            else:
                self._idle.append(slot)
                return
        _settle_threadsafe(waiter, result=slot, on_cancelled=lambda: self._give_back(slot))


def _settle_threadsafe(fut: asyncio.Future, *, result: Any = None, exc: BaseException | None = None,
                       on_cancelled: Callable[[], None] | None = None) -> None:
    def settle() -> None:
        if fut.done():
            if on_cancelled is not None:
                on_cancelled()
        elif exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    try:
        fut.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:  # its loop is closed: nobody waits; hand the actor back
        if on_cancelled is not None:
            on_cancelled()


def _pool_closed_error() -> EnvError:
    return EnvError("RayEnvPool is shut down", status=TrajectoryStatus.ENV_ERROR, kind="pool_closed",
                    call="reset")


def _kill(ray: Any, actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _as_future(ref: Any) -> asyncio.Future:
    """An ObjectRef as an asyncio future on the running loop."""
    return asyncio.wrap_future(ref.future())


# ----------------------------------------------------------------------------- the proxy


class RemoteEnvironment(Environment):
    """An `Environment` whose episodes run in a leased actor of a `RayEnvPool`.

    `reset` leases an actor (waiting for a free one if all are busy) and keeps it for the
    episode; `close` hands it back for the next episode. Built by `RayEnvPool.factory()`.
    """

    def __init__(self, pool: RayEnvPool) -> None:
        super().__init__()
        self._pool = pool
        self._slot: _Slot | None = None

    @property
    def actor(self) -> Any:
        """The Ray handle of the leased actor (None between episodes)."""
        return None if self._slot is None else self._slot.actor

    async def reset(self, task: Task) -> Observation:
        if not isinstance(task, Task):
            raise TypeError(f"reset() takes an agentax Task, got {type(task).__name__}")
        for attempt in (0, 1):
            if self._slot is None:
                self._slot = await self._pool._acquire()
                self._adopt_limits(self._slot.limits or {})
            try:
                return await super().reset(task)
            except EnvError as e:
                if e.kind != "actor_died" or attempt == 1:
                    raise
                # The actor was dead before the episode began: nothing is lost, try a fresh one.
                self._pool._counts["reset_retries"] += 1
                self._release()
        raise AssertionError("unreachable")

    def _adopt_limits(self, limits: Mapping[str, Any]) -> None:
        pool = self._pool
        for name in ("reset_timeout_s", "step_timeout_s", "close_timeout_s"):
            explicit = pool._timeouts[name]
            inner = limits.get(name)
            if explicit is not None:
                setattr(self, name, explicit)
            else:
                setattr(self, name, None if inner is None else inner + pool.call_grace_s)

    async def _reset(self, task: Task) -> Observation:
        return await self._call("reset", task)

    async def _step(self, action: Action) -> StepResult:
        return await self._call("step", action)

    async def _close(self) -> None:
        self._release()

    def _release(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            self._pool._give_back(slot)

    async def _call(self, method: str, arg: Any) -> Any:
        slot, pool = self._slot, self._pool
        ray = pool._ray
        ref = getattr(slot.actor, method).remote(arg)
        try:
            out = await _as_future(ref)
        except asyncio.CancelledError:
            # Timed out here (or the episode was cancelled): the actor may still be busy.
            slot.tainted = True
            pool._counts["abandoned"] += 1
            raise
        except ray.exceptions.RayActorError as e:
            slot.dead = True
            pool._counts["deaths"] += 1
            raise EnvError(
                f"RemoteEnvironment.{method}: the environment actor died: {_short(e)}",
                status=TrajectoryStatus.ENV_ERROR, kind="actor_died", call=method,
            ) from None
        except ray.exceptions.RayError as e:
            raise EnvError(
                f"RemoteEnvironment.{method}: remote call failed: {_short(e)}",
                status=TrajectoryStatus.ENV_ERROR, kind="remote_error", call=method,
            ) from None
        if out[0] == "ok":
            return out[1]
        _, status, kind, message = out
        if status == TrajectoryStatus.TIMEOUT.value:
            slot.tainted = True  # a hung call may still hold the environment's thread
        raise EnvError(message, status=TrajectoryStatus(status), kind=kind, call=method)

    def _fail(
        self, call: str, kind: str, message: str, status: TrajectoryStatus = TrajectoryStatus.ENV_ERROR
    ) -> EnvError:
        if kind == "timeout":  # only the proxy's own limit ends up here; the actor's come as EnvError
            self._pool._counts["call_timeouts"] += 1
        return super()._fail(call, kind, message, status)

    def __repr__(self) -> str:
        n = None if self._slot is None else self._slot.number
        return f"RemoteEnvironment(actor={n})"
