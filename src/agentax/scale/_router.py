"""`EngineRouter`: several engine replicas behind the one-engine API, with conversation affinity.

The router has the engine's front end (`generate`, `release`, `update_weights`,
`policy_version`, `stats`), so a `Collector` or a `Pipeline` takes it wherever it takes an
`Engine`. Routing:

* a new conversation (`sequence_id=None`) goes to the least-loaded healthy replica (fewest
  live conversations; ties to the one that has served fewer);
* a continuation goes to the replica that holds the conversation's KV cache (affinity by
  sequence id), so multi-turn episodes never re-prefill their history;
* sequence ids are the router's own (each replica numbers its sequences from 1), mapped to
  `(replica, local id)` until `release`.

Weights: `update_weights(state, version)` hands the same version to every replica. Local
engines get it placed on their devices by their placement function, one after another.
Ray replicas get it through a `WeightSync` (`_weight_sync.py`): cast and copied to the host
once, one object-store transfer per chunk shared by all replicas, all of them in parallel,
in the background. `policy_version` is the minimum over the live replicas: a token sampled
anywhere after that moment is at least that fresh, and every token still carries the exact
version of the weights that produced it, so staleness accounting is unchanged by replication.

Failures: a replica that raises `EngineError`, dies, fails a publication, or is found stuck by
the watchdog (`_health.py`: no answer to a probe for `stuck_after_s`, or no progress with
requests in flight for `no_progress_after_s`) is dropped: out of rotation, its actor killed,
the trace flushed. Its in-flight requests re-run on another replica, and its conversations
continue there: the router keeps each conversation's tokens, so the new replica prefills the
history once.
Both are counted by reason (`stats().reruns`, `stats().moved`). With no replica left,
`generate` raises `ReplicasLost` (an `EngineError`: the pipeline stops with `RunFailed`) and
`update_weights` raises `RunFailed`, each with one line naming the replica and the stage.

jax and the engine are imported lazily so that `agentax.scale` stays cheap to import in
environment actors, which never touch a model.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentax.contracts import stream_whole
from agentax.records import Completion, SamplingParams
from agentax.scale._health import ReplicaWatchdog
from agentax.scale._routing import (
    RouterStats,
    _as_state,
    _DevicePlacement,
    _engine_error,
    _Lost,
    _replicas_lost,
    _resolve,
    _retrieve,
)
from agentax.scale._weight_sync import WeightSync, WeightSyncConfig, run_failed
from agentax.trace import get_tracer

__all__ = ["EngineRouter", "RouterStats"]

log = logging.getLogger(__name__)

REPLICA_DROPPED = "replica_dropped"
"""Trace instant on the engine track when the router drops a replica (args: replica, stage,
reason, detail)."""


Placement = Callable[[Any], Any]


class EngineRouter:
    """Routes generation requests over engine replicas; itself usable as an engine.

    Args:
      replicas: engines (local `Engine`s, `RayEngineReplica`s, anything with the same
        `generate` / `release` / `update_weights` / `policy_version`).
      placements: one per replica, `state -> state` applied to published weights before
        they reach that replica (e.g. `jax.device_put` onto its devices); None leaves the
        state as given. `EngineRouter.on_devices` fills them in.
      weight_sync: how weights reach Ray replicas when every replica is one
        (`WeightSyncConfig`); None updates them one after another (`update_weights_serial`).
      stuck_after_s: a Ray replica that leaves a health probe unanswered this long is dropped.
      no_progress_after_s: a Ray replica whose engine makes no progress this long while it
        has requests in flight is dropped (longer: a compilation makes no progress either).
      probe_interval_s: seconds between two health probes of a Ray replica.
      start_timeout_s: how long a Ray replica may take to start (build its engine) before
        it is dropped; also bounds the first publication's wait for the replicas.
    """

    def __init__(
        self,
        replicas: Sequence[Any],
        *,
        placements: Sequence[Placement | None] | None = None,
        weight_sync: WeightSyncConfig | None = WeightSyncConfig(),
        stuck_after_s: float = 20.0,
        no_progress_after_s: float = 120.0,
        probe_interval_s: float = 1.0,
        start_timeout_s: float = 600.0,
    ):
        replicas = list(replicas)
        if not replicas:
            raise ValueError("EngineRouter needs at least one replica")
        for i, r in enumerate(replicas):
            missing = [m for m in ("generate", "release", "update_weights")
                       if not callable(getattr(r, m, None))]
            if missing:
                raise TypeError(
                    f"replica {i} ({type(r).__name__}) lacks {', '.join(missing)}(); pass engines"
                )
        if placements is not None and len(placements) != len(replicas):
            raise ValueError(f"got {len(placements)} placements for {len(replicas)} replicas")
        self.replicas = tuple(replicas)
        self.placements = tuple(placements) if placements is not None else (None,) * len(replicas)
        self._lock = threading.RLock()  # guards the routing tables; never held across an await
        self._routes: dict[int, tuple[int, int]] = {}
        self._live = [0] * len(replicas)
        self._routed = [0] * len(replicas)
        self._down: set[int] = set()
        self._continuations = 0
        self._ids = itertools.count(1)
        self._published: int | None = None
        self._history: dict[int, list[np.ndarray]] = {}  # tokens of each live conversation
        self._inflight = [0] * len(replicas)
        self._waiters: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = (
            collections.defaultdict(set))
        self._dropped: dict[int, str] = {}
        self._dropped_at: dict[int, tuple[str, str]] = {}  # index -> (short line, detail)
        self._last_dropped: int | None = None
        self._reruns: collections.Counter[str] = collections.Counter()
        self._moved: collections.Counter[str] = collections.Counter()
        if min(stuck_after_s, no_progress_after_s, probe_interval_s, start_timeout_s) <= 0:
            raise ValueError("stuck_after_s, no_progress_after_s, probe_interval_s and "
                             "start_timeout_s must be > 0")
        ray_replicas = [i for i, r in enumerate(self.replicas) if callable(getattr(r, "heartbeat", None))]
        self._sync: WeightSync | None = None
        if weight_sync is not None and ray_replicas and len(ray_replicas) == len(self.replicas):
            self._sync = WeightSync(self.replicas, weight_sync, live=self.live_indices,
                                    on_lost=self._drop, lost_line=self._lost_line,
                                    control_timeout_s=start_timeout_s)
        self._watchdog = (ReplicaWatchdog(self, ray_replicas, stuck_after_s=stuck_after_s,
                                          no_progress_after_s=no_progress_after_s,
                                          probe_interval_s=probe_interval_s,
                                          start_timeout_s=start_timeout_s)
                          if ray_replicas else None)

    @classmethod
    def on_devices(
        cls,
        model: Any,
        make_engine: Callable[[Any], Any],
        num_replicas: int,
        *,
        devices: Sequence[Any] | None = None,
    ) -> EngineRouter:
        """Builds `num_replicas` engines, each on its own device, from one model's weights.

        The devices (default `jax.local_devices()`) are split into `num_replicas` disjoint,
        equal, contiguous subsets; replica i gets a copy of `model`'s weights committed to
        the first device of subset i, and its KV cache there too. (A replica spanning several
        devices needs a sharded engine; build those yourself and pass `placements`.)

        Args:
          model: an `agentax.models.Transformer` (its weights are copied to every replica).
          make_engine: `model -> Engine`, e.g. `lambda m: Engine(m, cfg, eos_token_ids=...)`.
          num_replicas: how many engines.
          devices: the devices to split.

        Raises:
          ValueError: fewer devices than replicas.
        """
        import jax  # noqa: PLC0415 - see the module docstring
        from flax import nnx  # noqa: PLC0415

        devices = list(devices if devices is not None else jax.local_devices())
        if num_replicas < 1 or len(devices) < num_replicas:
            raise ValueError(
                f"on_devices: {num_replicas} replicas need at least as many devices; have "
                f"{len(devices)} (on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N "
                "before importing jax)"
            )
        per = len(devices) // num_replicas
        graphdef, state = nnx.split(model)
        engines, placements = [], []
        for i in range(num_replicas):
            device = devices[i * per]
            place = _DevicePlacement(device)
            with jax.default_device(device):
                engines.append(make_engine(nnx.merge(graphdef, place(state))))
            placements.append(place)
        return cls(engines, placements=placements)

    # ------------------------------------------------------------------ engine API

    async def generate(
        self,
        prompt_ids: Any,
        params: SamplingParams | None = None,
        *,
        sequence_id: int | None = None,
    ) -> Completion:
        """Generates on the replica that holds `sequence_id`, or the least-loaded one.

        Same contract as `Engine.generate`; the returned `Completion.sequence_id` is the
        router's id for the conversation (pass it back to continue, `release` it at the end).
        A request whose replica is dropped while it runs re-runs on another replica (the
        conversation's history prefilled there), as does the next turn of a conversation whose
        replica was dropped between turns.

        Raises:
          SequenceError: `sequence_id` is unknown to the router (released or never issued).
          EngineError: (`ReplicasLost`) every replica was dropped; the message names them.
          PromptTooLong, ValueError: the replica's own errors for a bad request.
        """
        prompt = np.asarray(prompt_ids)
        if prompt.size == 0:
            prompt = prompt.astype(np.int32)
        if sequence_id is None:
            with self._lock:
                index = self._pick()
                self._live[index] += 1
                self._routed[index] += 1
            gid, local, history = None, None, []
        else:
            gid = int(sequence_id)
            with self._lock:
                route = self._routes.get(gid)
                self._continuations += route is not None
                history = self._history.get(gid, [])
            if route is None:
                from agentax.engine import SequenceError  # noqa: PLC0415

                raise SequenceError(
                    f"unknown sequence_id {sequence_id}: it was released or never issued by this router"
                )
            index, local = route
        try:
            completion, index, local = await self._generate_on(index, local, prompt, history, params)
        except BaseException:
            if gid is None:
                with self._lock:
                    self._live[index] -= 1  # the replica forgets a failed or cancelled new sequence
            raise
        with self._lock:
            if gid is None:
                gid = next(self._ids)
            self._routes[gid] = (index, completion.sequence_id)
            self._history[gid] = [*history, prompt, np.asarray(completion.token_ids, np.int32)]
        return dataclasses.replace(completion, sequence_id=gid, prompt_len=int(prompt.size))

    async def _generate_on(self, index: int, local: int | None, prompt: np.ndarray,
                           history: list[np.ndarray], params: Any) -> tuple[Completion, int, int | None]:
        """Runs one request, moving it (with the conversation's history) off dropped replicas."""
        while True:
            if index in self._down:
                reason = self._dropped.get(index, "replica_down").split(" ", 1)[0]
                with self._lock:
                    (self._reruns if local is None and not history else self._moved)[reason] += 1
                index, local = self._move(index), None
            feed = prompt if local is not None or not history else np.concatenate([*history, prompt])
            try:
                return await self._call(index, feed, params, local), index, local
            except _Lost as e:
                with self._lock:
                    self._reruns[e.reason] += 1
                index, local = self._move(index), None

    def _move(self, index: int) -> int:
        """A healthy replica for a conversation leaving dropped replica `index`."""
        with self._lock:
            new = self._pick()
            self._live[index] -= 1
            self._live[new] += 1
            self._routed[new] += 1
        return new

    async def _call(self, index: int, prompt_ids: Any, params: Any, local: int | None) -> Completion:
        """One request on one replica, abandoned (`_Lost`) if the replica is dropped meanwhile."""
        loop = asyncio.get_running_loop()
        lost = loop.create_future()
        waiter = (loop, lost)
        with self._lock:
            if index in self._down:
                raise _Lost(index, self._dropped.get(index, "replica_down").split(" ", 1)[0])
            self._waiters[index].add(waiter)
            self._inflight[index] += 1
        request = asyncio.ensure_future(
            self.replicas[index].generate(prompt_ids, params, sequence_id=local))
        try:
            await asyncio.wait({request, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            with self._lock:
                self._waiters[index].discard(waiter)
                self._inflight[index] -= 1
            if not request.done():
                request.cancel()
                request.add_done_callback(_retrieve)
            lost.cancel()
        if not request.done():
            raise _Lost(index, lost.result() if lost.done() and not lost.cancelled() else "replica_down")
        try:
            return request.result()
        except _engine_error() as e:  # the engine failed or was shut down: drop the replica
            self._drop(index, "generate", "engine_error", f"{type(e).__name__}: {e}")
            raise _Lost(index, "engine_error") from e
        except Exception as e:
            if type(e).__name__ in ("ActorDiedError", "RayActorError", "ActorUnavailableError"):
                self._drop(index, "generate", "replica_died", f"{type(e).__name__}: {e}")
                raise _Lost(index, "replica_died") from e
            raise

    def _pick(self) -> int:
        healthy = [i for i in range(len(self.replicas)) if i not in self._down]
        if not healthy:
            raise _replicas_lost(self._lost_line())
        return min(healthy, key=lambda i: (self._live[i], self._routed[i], i))

    def _lost_line(self) -> str:
        """'all N engine replicas are down: replica 0 (reason) in stage; ...', short enough for
        `RunFailed`'s one line; the last one dropped carries its detail."""
        with self._lock:
            parts = [self._dropped_at.get(i, (f"replica {i} (down)", "")) for i in sorted(self._down)]
            last = self._last_dropped
        lines = [short + (f" ({detail})" if i == last else "")
                 for i, (short, detail) in zip(sorted(self._down), parts)]
        return f"all {len(self.replicas)} engine replicas are down: " + "; ".join(lines)

    def stream(self, prompt_ids: Any, params: SamplingParams | None = None, *,
               sequence_id: int | None = None):
        """`generate` as a stream of one item: replicas answer whole."""
        return stream_whole(self, prompt_ids, params, sequence_id=sequence_id)

    def release(self, sequence_id: int | None) -> None:
        """Forgets a conversation and frees its KV cache on its replica; unknown ids are ignored."""
        if sequence_id is None:
            return
        with self._lock:
            route = self._routes.pop(int(sequence_id), None)
            self._history.pop(int(sequence_id), None)
            if route is not None:
                self._live[route[0]] -= 1
            down = route is not None and route[0] in self._down
        if route is not None and not down:
            self.replicas[route[0]].release(route[1])

    def replica_of(self, sequence_id: int) -> int | None:
        """Index of the replica that holds a conversation (None if unknown)."""
        with self._lock:
            route = self._routes.get(int(sequence_id))
        return None if route is None else route[0]

    # ------------------------------------------------------------------ health

    def live_indices(self) -> list[int]:
        """Indices of the replicas in rotation."""
        with self._lock:
            return [i for i in range(len(self.replicas)) if i not in self._down]

    def inflight(self, index: int) -> int:
        """Requests now waiting on replica `index`."""
        return self._inflight[index]

    def stage_of(self, index: int) -> str:
        """What replica `index` is doing, for a report: 'generate' with requests in flight."""
        return "generate" if self._inflight[index] else "idle (health probe)"

    def _drop(self, index: int, stage: str, reason: str, detail: str) -> None:
        """Takes a replica out of rotation (once): in-flight requests move, trace flushed.

        Safe from any thread (the watchdog's, the publisher's, the event loop's).
        """
        with self._lock:
            if index in self._down:
                return
            self._down.add(index)
            line = (f"{reason} replica {index} ({self.replicas[index]!r}) in {stage}: "
                    f"{' '.join(str(detail).split())[:300]}")
            self._dropped[index] = line
            self._dropped_at[index] = (f"replica {index} ({reason}) in {stage}", str(detail)[:160])
            self._last_dropped = index
            waiters = list(self._waiters.pop(index, ()))
            left = len(self.replicas) - len(self._down)
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut, reason)
        log.error("engine router: dropped %s; %d of %d replicas left", line, left, len(self.replicas))
        tracer = get_tracer()
        tracer.instant(REPLICA_DROPPED, track="engine", args={
            "replica": index, "stage": stage, "reason": reason, "replicas_left": left})
        replica = self.replicas[index]
        kill = getattr(replica, "kill", None)

        def after() -> None:  # off the caller's thread: flushing and killing may take a while
            tracer.flush()  # `agentax doctor` sees where the run stood
            if callable(kill):
                kill()  # a stuck actor may hold a device; a dropped one never serves again

        threading.Thread(target=after, name="agentax-replica-drop", daemon=True).start()

    # ------------------------------------------------------------------ weights

    def update_weights(self, state: Any, version: int) -> None:
        """Publishes one version of the weights to every live replica.

        With Ray replicas and `weight_sync` set, this returns after the cast and the
        device->host copy; the transfer runs in the background (`wait_published` waits for
        it). Otherwise each replica is updated in turn.

        Args:
          state: what `Engine.update_weights` takes (an `nnx.State`, a model, a leaf list).
          version: the policy version; must not go below the last one published.

        Raises:
          ValueError: `version` is older than the last published one.
          RunFailed: no replica is left to publish to.
        """
        version = int(version)
        if self._published is not None and version < self._published:
            raise ValueError(
                f"update_weights: version {version} is older than the published {self._published}; "
                "versions must not go backwards (staleness accounting relies on it)"
            )
        if self._sync is not None:
            self._sync.publish(state, version)
        else:
            self.update_weights_serial(state, version)
        self._published = version

    def update_weights_serial(self, state: Any, version: int) -> None:
        """Updates the live replicas one after another, each with its own full copy.

        The path for local engines (a device copy each); for Ray replicas the slow baseline
        (one device->host copy and object-store transfer per replica) that `WeightSync`
        replaces. A replica that fails is dropped (stage 'publish').

        Raises:
          RunFailed: no replica is left.
        """
        if any(p is not None for p in self.placements):
            state = _as_state(state)
        if self._sync is not None:
            self._sync.wait(None)  # no background publication may land after this one
            self._sync.forget_baseline()
        for i in self.live_indices():
            replica, place = self.replicas[i], self.placements[i]
            try:
                replica.update_weights(state if place is None else place(state), int(version))
            except Exception as e:  # noqa: BLE001 - a timeout, a dead actor, a failed engine
                if isinstance(e, ValueError) and "update_weights" in str(e):
                    raise  # the state does not fit the engine: the caller's bug
                reason = "replica_stuck" if "Timeout" in type(e).__name__ else "replica_died"
                self._drop(i, "publish", reason, f"{type(e).__name__}: {e}")
        if not self.live_indices():
            raise run_failed("replicas_lost", self._lost_line(), knob="the replicas' logs")

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """Waits until every live replica's engine decodes with the background publications'
        weights (False: timed out).

        Raises:
          RunFailed: a background publication lost every replica.
        """
        return True if self._sync is None else self._sync.wait(timeout_s)

    @property
    def policy_version(self) -> int:
        """The oldest version any live replica still decodes with (every new token is at least
        this). A Ray replica whose last heartbeat already reported the published version is
        not asked; the others are, in parallel, each bounded by `stuck_after_s` (a replica
        that does not answer in time counts with its last reported version)."""
        versions, ask = [], {}
        published = -1 if self._published is None else self._published
        for i in self.live_indices():
            cached = self._watchdog.version_of(i) if self._watchdog is not None else None
            if cached is not None and cached >= published:
                versions.append(cached)
            elif self._watchdog is not None and hasattr(self.replicas[i], "actor"):
                ask[i] = (cached, self.replicas[i].actor.policy_version.remote())
            else:
                versions.append(int(self.replicas[i].policy_version))
        if ask:
            ray = self._watchdog._ray
            refs = [ref for _, ref in ask.values()]
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=self._watchdog.stuck_after_s)[0])
            for i, (cached, ref) in ask.items():
                try:
                    versions.append(int(ray.get(ref)) if ref in ready else cached)
                except Exception:  # noqa: BLE001 - died meanwhile: the watchdog drops it
                    versions.append(cached)
            versions = [v for v in versions if v is not None]
        if not versions:
            raise _replicas_lost(self._lost_line())
        return min(versions)

    @property
    def published_version(self) -> int | None:
        """The last version handed to `update_weights` (None before the first)."""
        return self._published

    def stats(self) -> RouterStats:
        """A snapshot; dropped replicas report None (they are not asked)."""
        with self._lock:
            live, routed = tuple(self._live), tuple(self._routed)
            down, continuations = tuple(sorted(self._down)), self._continuations
            dropped = tuple(self._dropped[i] for i in sorted(self._dropped))
            reruns, moved = dict(self._reruns), dict(self._moved)
        try:
            version = self.policy_version
        except _engine_error():
            version = -1
        return RouterStats(
            replicas=self._replica_stats(down),
            live_sequences=live, routed=routed, continuations=continuations, down=down,
            policy_version=version, published_version=self._published, dropped=dropped,
            reruns=reruns, moved=moved,
            weight_sync=None if self._sync is None else self._sync.stats(),
        )

    def _replica_stats(self, down: tuple[int, ...]) -> tuple[Any, ...]:
        """Each live replica's stats; Ray replicas asked in parallel and bounded by
        `stuck_after_s` (a replica that does not answer in time reports None)."""
        out: list[Any] = [None] * len(self.replicas)
        remote = {}
        for i, r in enumerate(self.replicas):
            if i in down:
                continue
            if self._watchdog is not None and hasattr(r, "actor"):
                remote[i] = r.actor.stats.remote()
            else:
                out[i] = r.stats()
        if remote:
            ray = self._watchdog._ray
            ready, _ = ray.wait(list(remote.values()), num_returns=len(remote),
                                timeout=self._watchdog.stuck_after_s)
            for i, ref in remote.items():
                if ref in ready:
                    try:
                        out[i] = ray.get(ref)
                    except Exception:  # noqa: BLE001 - dropped meanwhile; the watchdog reports it
                        pass
        return tuple(out)

    @property
    def down(self) -> tuple[int, ...]:
        """Indices of the replicas taken out of rotation (cheap: no replica is asked)."""
        with self._lock:
            return tuple(sorted(self._down))

    def shutdown(self) -> None:
        """Stops the watchdog and the publisher; shuts live replicas down, kills dropped ones."""
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._sync is not None:
            self._sync.close()
        for i, r in enumerate(self.replicas):
            stop = getattr(r, "kill" if i in self._down else "shutdown", None)
            if callable(stop):
                stop()

    def __enter__(self) -> EngineRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"EngineRouter({len(self.replicas)} replicas, live={self._live})"
