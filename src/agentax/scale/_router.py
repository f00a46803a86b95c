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

Weights: `update_weights(state, version)` hands the same version to every replica (placed on
each replica's devices by its placement function). `policy_version` is the minimum over the
replicas: a token sampled anywhere after that moment is at least that fresh, and every token
still carries the exact version of the weights that produced it, so staleness accounting is
unchanged by replication.

jax and the engine are imported lazily so that `agentax.scale` stays cheap to import in
environment actors, which never touch a model.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from agentax.records import Completion, SamplingParams

__all__ = ["EngineRouter", "RouterStats"]

Placement = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterStats:
    """A snapshot of the router and its replicas."""

    replicas: tuple[Any, ...]
    """Each replica's own `stats()` (an `EngineStats` for local engines)."""
    live_sequences: tuple[int, ...]
    """Conversations routed to each replica and not yet released (its load)."""
    routed: tuple[int, ...]
    """New conversations sent to each replica so far."""
    continuations: int
    """Requests that continued a conversation on its replica."""
    down: tuple[int, ...]
    """Replicas taken out of rotation after they failed."""
    policy_version: int
    published_version: int | None


class EngineRouter:
    """Routes generation requests over engine replicas; itself usable as an engine.

    Args:
      replicas: engines (local `Engine`s, `RayEngineReplica`s, anything with the same
        `generate` / `release` / `update_weights` / `policy_version`).
      placements: one per replica, `state -> state` applied to published weights before
        they reach that replica (e.g. `jax.device_put` onto its devices); None leaves the
        state as given. `EngineRouter.on_devices` fills them in.
    """

    def __init__(self, replicas: Sequence[Any], *, placements: Sequence[Placement | None] | None = None):
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
        self._lock = threading.Lock()  # guards the routing tables; never held across an await
        self._routes: dict[int, tuple[int, int]] = {}
        self._live = [0] * len(replicas)
        self._routed = [0] * len(replicas)
        self._down: set[int] = set()
        self._continuations = 0
        self._ids = itertools.count(1)
        self._published: int | None = None

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

        Raises:
          SequenceError: `sequence_id` is unknown to the router (released or never issued).
          EngineError: every replica is down; or the chosen replica's own errors.
        """
        if sequence_id is None:
            return await self._generate_new(prompt_ids, params)
        with self._lock:
            route = self._routes.get(int(sequence_id))
            self._continuations += route is not None
        if route is None:
            from agentax.engine import SequenceError  # noqa: PLC0415

            raise SequenceError(
                f"unknown sequence_id {sequence_id}: it was released or never issued by this router"
            )
        index, local = route
        completion = await self._call(index, prompt_ids, params, local)
        return dataclasses.replace(completion, sequence_id=int(sequence_id))

    async def _generate_new(self, prompt_ids: Any, params: SamplingParams | None) -> Completion:
        with self._lock:
            index = self._pick()
            self._live[index] += 1
            self._routed[index] += 1
        try:
            completion = await self._call(index, prompt_ids, params, None)
        except BaseException:
            with self._lock:
                self._live[index] -= 1  # the replica forgets a failed or cancelled new sequence
            raise
        with self._lock:
            gid = next(self._ids)
            self._routes[gid] = (index, completion.sequence_id)
        return dataclasses.replace(completion, sequence_id=gid)

    async def _call(self, index: int, prompt_ids: Any, params: Any, local: int | None) -> Completion:
        from agentax.engine import EngineError  # noqa: PLC0415

        try:
            return await self.replicas[index].generate(prompt_ids, params, sequence_id=local)
        except EngineError:
            with self._lock:
                self._down.add(index)  # a failed or closed engine takes no new conversations
            raise

    def _pick(self) -> int:
        healthy = [i for i in range(len(self.replicas)) if i not in self._down]
        if not healthy:
            from agentax.engine import EngineError  # noqa: PLC0415

            raise EngineError(f"all {len(self.replicas)} engine replicas are down")
        return min(healthy, key=lambda i: (self._live[i], self._routed[i], i))

    def release(self, sequence_id: int | None) -> None:
        """Forgets a conversation and frees its KV cache on its replica; unknown ids are ignored."""
        if sequence_id is None:
            return
        with self._lock:
            route = self._routes.pop(int(sequence_id), None)
            if route is not None:
                self._live[route[0]] -= 1
        if route is not None:
            self.replicas[route[0]].release(route[1])

    def replica_of(self, sequence_id: int) -> int | None:
        """Index of the replica that holds a conversation (None if unknown)."""
        with self._lock:
            route = self._routes.get(int(sequence_id))
        return None if route is None else route[0]

    def update_weights(self, state: Any, version: int) -> None:
        """Publishes one version of the weights to every replica.

        Args:
          state: what `Engine.update_weights` takes (an `nnx.State`, a model, a leaf list).
          version: the policy version; must not go below the last one published.

        Raises:
          ValueError: `version` is older than the last published one.
        """
        version = int(version)
        if self._published is not None and version < self._published:
            raise ValueError(
                f"update_weights: version {version} is older than the published {self._published}; "
                "versions must not go backwards (staleness accounting relies on it)"
            )
        if any(p is not None for p in self.placements):
            state = _as_state(state)
        for replica, place in zip(self.replicas, self.placements):
            replica.update_weights(state if place is None else place(state), version)
        self._published = version

    @property
    def policy_version(self) -> int:
        """The oldest version any replica still decodes with (every new token is at least this)."""
        return min(int(r.policy_version) for r in self.replicas)

    @property
    def published_version(self) -> int | None:
        """The last version handed to `update_weights` (None before the first)."""
        return self._published

    def stats(self) -> RouterStats:
        with self._lock:
            live, routed = tuple(self._live), tuple(self._routed)
            down, continuations = tuple(sorted(self._down)), self._continuations
        return RouterStats(
            replicas=tuple(r.stats() for r in self.replicas), live_sequences=live, routed=routed,
            continuations=continuations, down=down, policy_version=self.policy_version,
            published_version=self._published,
        )

    def shutdown(self) -> None:
        """Shuts every replica down."""
        for r in self.replicas:
            shutdown = getattr(r, "shutdown", None)
            if callable(shutdown):
                shutdown()

    def __enter__(self) -> EngineRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"EngineRouter({len(self.replicas)} replicas, live={self._live})"


class _DevicePlacement:
    """Commits a pytree of weights to one device (a reshard when it lives elsewhere)."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def __call__(self, state: Any) -> Any:
        import jax  # noqa: PLC0415

        return jax.device_put(state, self.device)

    def __repr__(self) -> str:
        return f"_DevicePlacement({self.device})"


def _as_state(state: Any) -> Any:
    """A model becomes its `nnx.State` (placements move arrays, not modules)."""
    from flax import nnx  # noqa: PLC0415

    if isinstance(state, nnx.Module):
        return nnx.state(state)
    return state
