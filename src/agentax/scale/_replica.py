"""`RayEngineReplica`: an `Engine` inside a Ray actor, driven through the engine API.

On a cluster each replica is an actor placed on its own accelerators (`num_gpus`, custom
`resources` such as `{"TPU": 4}`); put several behind an `EngineRouter`. The actor builds its
engine with `make_engine()` (called in the actor process, so weights load where they run),
serves `generate` on its own event loop (the engine batches concurrent requests as usual) and
takes weights as host arrays, which it puts on its devices before the swap: either whole
(`update_weights`, the serial path) or as chunks of a `WeightSync` publication shared by all
replicas (`receive_chunk` ... `commit_weights`, see `_weight_sync.py`). `heartbeat` answers
while the actor's event loop runs, with the engine's progress counters, for the router's
watchdog.

Engine errors raised in the actor (`SequenceError`, `PromptTooLong`, `EngineError`) come back
as exceptions of the same class (Ray's task errors subclass the cause).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from agentax.contracts import stream_whole
from agentax.records import Completion, SamplingParams
from agentax.scale._ray import check_feasible as _check_feasible
from agentax.scale._ray import ensure_ray_initialized, require_ray
from agentax.scale._routing import _as_state
from agentax.scale._weight_sync import _np_dtype

__all__ = ["RayEngineReplica"]


class _EngineActor:
    """Body of the engine actor."""

    def __init__(self, make_engine: Callable[[], Any]) -> None:
        self.engine = make_engine()
        self._incoming: _Incoming | None = None
        self._host: list[np.ndarray] | None = None  # last committed host weights (delta base)
        self._host_version: int | None = None
        self._spec: list[tuple[tuple[int, ...], str]] | None = None

    async def generate(self, prompt_ids: Any, params: Any, sequence_id: int | None) -> Completion:
        return await self.engine.generate(prompt_ids, params, sequence_id=sequence_id)

    def release(self, sequence_id: int) -> None:
        self.engine.release(sequence_id)

    def update_weights(self, state: Any, version: int) -> int:
        import jax  # noqa: PLC0415 - the actor process owns the devices

        self.engine.update_weights(jax.device_put(state), version)
        self._host = self._host_version = None  # no longer a valid delta base
        return version

    async def heartbeat(self) -> tuple[int, int, int]:
        """(policy version, decode steps, resolved requests): answers while the loop runs."""
        s = self.engine.stats()
        return s.policy_version, s.steps + s.prefill_calls, s.completed + s.failed

    def policy_version(self) -> int:
        return self.engine.policy_version

    async def wait_published(self, timeout_s: float | None) -> bool:
        return await asyncio.to_thread(self.engine.wait_published, timeout_s)

    def stats(self) -> Any:
        return self.engine.stats()

    def shutdown(self) -> None:
        self.engine.shutdown()

    # ------------------------------------------------------------------ chunked weights

    def weight_spec(self) -> list[tuple[tuple[int, ...], str]]:
        """Shape and dtype of each engine weight leaf (what a publisher casts to)."""
        if self._spec is None:  # fixed for the engine's life
            self._spec = [(tuple(w.shape), str(w.dtype))
                          for w in _engine_weights(self.engine, arrays=False)]
        return self._spec

    async def receive_chunk(self, version: int, ranges: Any, parts: list[np.ndarray],
                            base_version: int | None, keep: bool, total: int) -> int | None:
        """Takes one chunk (element ranges of flat leaves) of the version being assembled.

        `parts` arrive read-only from the object store (zero-copy). A whole leaf goes straight
        onto the engine's device (one copy; none on a CPU device, where the engine's own
        `update_weights` aliases it); a piece of a leaf larger than a chunk is copied
        into a host buffer, put on the device at commit. The copies run on a thread, so
        generation keeps going. A delta (`base_version` set) patches a copy of the host
        weights committed at `base_version`; `keep` keeps this version's host arrays as the
        base of the next delta. The call that brings the `total`-th chunk of the version
        commits it (no extra round trip) and returns the version; the others return None.
        """
        inc = self._incoming
        if inc is None or inc.version != version:
            if base_version is not None and base_version != self._host_version:
                raise ValueError(
                    f"delta publication on base version {base_version}, but this replica holds "
                    f"host weights of version {self._host_version}; publish in full")
            self._incoming = inc = _Incoming(version, self.weight_spec())
        current = _engine_weights(self.engine, arrays=False)  # their shardings
        whole, pieces = [], []
        for (leaf, a, b), part in zip(ranges, parts):
            if a == 0 and b == inc.sizes[leaf]:
                whole.append((leaf, part))
            else:
                buf = await inc.buffer(leaf, self._host if base_version is not None else None)
                pieces.append((buf, a, b, part))

        def copy() -> list:
            import jax  # noqa: PLC0415 - the actor process owns the devices

            for buf, a, b, part in pieces:
                buf[a:b] = part
            placed = [_on_device(part.reshape(inc.spec[leaf][0]), current[leaf].sharding)
                      for leaf, part in whole]
            return jax.block_until_ready(placed)

        if not pieces and all(_aliases(current[leaf].sharding) for leaf, _ in whole):
            # Object-store memory for a CPU device: handed to the engine as is, whose
            # update_weights puts it on the device, aliasing it (no copy, nothing blocks; one
            # pass over the leaves instead of two, the per-leaf cost being what a publication
            # to several replicas on few cores spends beyond the transfer).
            placed = [part.reshape(inc.spec[leaf][0]) for leaf, part in whole]
        else:
            placed = await asyncio.to_thread(copy)
        for (leaf, part), array in zip(whole, placed):
            inc.device[leaf] = array
            if keep:
                inc.host[leaf] = part  # pins the object-store copy: the next delta's base
        for leaf, a, b in ranges:
            inc.received[leaf] += b - a
        inc.chunks += 1
        if inc.chunks < total:
            return None
        if self._incoming is inc:
            self._incoming = None
        return await self._commit(inc, version, base_version, keep)

    async def commit_weights(self, version: int, base_version: int | None, keep: bool) -> int:
        """Commits a delta publication in which no chunk changed (only the version moves)."""
        inc, self._incoming = self._incoming, None
        if inc is None or inc.version != version:
            inc = None
        return await self._commit(inc, version, base_version, keep)

    async def _commit(self, inc: Any, version: int, base_version: int | None, keep: bool) -> int:
        """Hands the assembled version to the engine (swapped between two decode steps)."""
        import jax  # noqa: PLC0415

        spec = self.weight_spec()
        delta = base_version is not None
        if inc is None:
            if not delta:
                raise ValueError(f"commit of version {version} without any chunk received")
            inc = _Incoming(version, spec)  # a delta in which nothing changed
        if inc.version != version:
            raise ValueError(f"commit of version {version}, but version {inc.version} was received")
        # Shardings, and the arrays of a delta's unchanged leaves.
        current = _engine_weights(self.engine, arrays=delta)
        leaves: list[Any] = [None] * len(spec)
        host: list[Any] = [None] * len(spec)
        assembled = []
        for leaf, (shape, _) in enumerate(spec):
            touched = leaf in inc.device or leaf in inc.buffers
            if not delta and inc.received[leaf] != inc.sizes[leaf]:
                raise ValueError(f"version {version}: leaf {leaf} got {inc.received[leaf]} of "
                                 f"{inc.sizes[leaf]} elements; a chunk was lost")
            if leaf in inc.device:
                leaves[leaf], host[leaf] = inc.device[leaf], inc.host.get(leaf)
            elif leaf in inc.buffers:
                buf = await inc.buffers[leaf]
                assembled.append((leaf, buf.reshape(shape)))
                host[leaf] = buf
            elif delta and not touched:  # unchanged since the base version
                leaves[leaf], host[leaf] = current[leaf], self._host[leaf]

        def place() -> list:
            return jax.block_until_ready(
                [_on_device(buf, current[leaf].sharding) for leaf, buf in assembled])

        for (leaf, _), array in zip(assembled, await asyncio.to_thread(place) if assembled else []):
            leaves[leaf] = array
        # Placed, or object-store arrays a CPU device aliases: update_weights copies nothing.
        self.engine.update_weights(leaves, version)
        # The engine swaps them in at its next step; the commit returns once it has. So a
        # publication that reached this replica is one its engine decodes with, and the next
        # delta reads its unchanged leaves from the engine's weights of this version.
        if not await asyncio.to_thread(self.engine.wait_published, None):
            raise RuntimeError(f"version {version}: the engine stopped before swapping it in")
        self._host, self._host_version = (host, version) if keep else (None, None)
        return version


class _Incoming:
    """The pieces of a version being assembled from chunks."""

    def __init__(self, version: int, spec: list[tuple[tuple[int, ...], str]]) -> None:
        self.version = version
        self.spec = spec
        self.sizes = [int(np.prod(shape, dtype=np.int64)) for shape, _ in spec]
        self.device: dict[int, Any] = {}  # whole leaves, on the engine's devices
        self.host: dict[int, np.ndarray] = {}  # their host arrays (kept for a delta base)
        self.buffers: dict[int, asyncio.Future] = {}  # leaves larger than a chunk, assembling
        self.received: collections.Counter[int] = collections.Counter()
        self.chunks = 0

    async def buffer(self, leaf: int, base: list[np.ndarray] | None) -> np.ndarray:
        fut = self.buffers.get(leaf)
        if fut is None:
            if base is not None:  # a delta patches a copy of the previous weights
                fut = asyncio.ensure_future(asyncio.to_thread(np.array, base[leaf], copy=True))
            else:
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(np.empty(self.sizes[leaf], _np_dtype(self.spec[leaf][1])))
            self.buffers[leaf] = fut
        return await fut


class _Writable:
    """A writable-flagged view of a read-only host array, for DLPack (which cannot say
    read-only). Nothing writes through it: the engine never donates its weights."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array  # keeps the object-store buffer alive as long as the view is
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface


def _aliases(sharding: Any) -> bool:
    """Whether `_on_device` can alias host memory on `sharding` (the process's first CPU
    device alone)."""
    import jax  # noqa: PLC0415

    devices = sharding.device_set
    if len(devices) != 1:
        return False
    device = next(iter(devices))
    return device.platform == "cpu" and device == jax.devices("cpu")[0]


def _on_device(host: np.ndarray, sharding: Any) -> Any:
    """`host` on `sharding`. On a single CPU device the array aliases `host` (no copy): for
    object-store memory, every replica on a node then decodes from the node's one copy of
    the weights, kept alive (and immutable) as long as the engine uses them. Elsewhere, or
    when the buffer does not suit XLA (not 64-byte aligned, an exotic dtype), one copy."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    if host.flags.c_contiguous and _aliases(sharding):
        try:  # (the engine's update_weights commits it to its device: still no copy)
            return jnp.from_dlpack(np.asarray(_Writable(host)), copy=False)
        except (BufferError, TypeError, ValueError, RuntimeError):
            pass
    return jax.device_put(host, sharding)


def _engine_weights(engine: Any, *, arrays: bool = True) -> list:
    """The engine's current weight leaves in `jax.tree.leaves` order: device arrays, or
    without `arrays` what each must be (shape, dtype, sharding). An agentax engine holding its
    layers stacked (`EngineConfig.scan_layers`) gives its layers' leaves as slices of its
    stacks (copies): ask for arrays only where they are used."""
    weights = getattr(engine, "weights", None)
    if weights is not None:
        return list(weights)
    return engine._runner.leaves() if arrays else list(engine._runner.leaf_specs)


_ACTOR_CLASS: Any = None


class RayEngineReplica:
    """One engine in a Ray actor, with the engine's front end.

    Args:
      make_engine: zero-argument callable building the `Engine` (pickled, run in the actor).
      num_cpus / num_gpus / resources: what Ray reserves for the actor (its placement).
      check_feasible: refuse at once a request that no live node can ever place (False on an
        autoscaling cluster whose nodes come later).
      actor_options: further `ray.remote` options.
      call_timeout_s: limit for the blocking control calls (`policy_version`, `stats`,
        `update_weights`, `shutdown`); generation is bounded by the collector's model timeout
        and, behind an `EngineRouter`, by its watchdog (`stuck_after_s`).
    """

    def __init__(
        self,
        make_engine: Callable[[], Any],
        *,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        resources: Mapping[str, float] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        call_timeout_s: float = 120.0,
        check_feasible: bool = True,
    ) -> None:
        global _ACTOR_CLASS
        self._ray = ray = require_ray()
        ensure_ray_initialized(ray)
        if _ACTOR_CLASS is None:
            _ACTOR_CLASS = ray.remote(_EngineActor)
        options = {"num_cpus": num_cpus, "num_gpus": num_gpus, **dict(actor_options or {})}
        if resources:
            options["resources"] = dict(resources)
        if check_feasible:
            _check_feasible(ray, options, "RayEngineReplica")
        # Requests of many episodes must be in flight at once for the engine to batch them.
        options.setdefault("max_concurrency", 1000)
        self.call_timeout_s = call_timeout_s
        self.up = False
        """Whether the actor has answered a call or a router's health probe (its engine is
        built): a router holds its first probe to `stuck_after_s`, not `start_timeout_s`."""
        self.actor = _ACTOR_CLASS.options(**options).remote(make_engine)

    async def generate(
        self, prompt_ids: Any, params: SamplingParams | None = None, *, sequence_id: int | None = None
    ) -> Completion:
        """`Engine.generate` in the actor (awaitable from any event loop)."""
        out = await self.actor.generate.remote(prompt_ids, params, sequence_id)
        self.up = True
        return out

    def stream(self, prompt_ids: Any, params: SamplingParams | None = None, *,
               sequence_id: int | None = None):
        """`generate` as a stream of one item: the actor answers whole."""
        return stream_whole(self, prompt_ids, params, sequence_id=sequence_id)

    def release(self, sequence_id: int | None) -> None:
        """Fire-and-forget release of a sequence."""
        if sequence_id is not None:
            self.actor.release.remote(int(sequence_id))

    def update_weights(self, state: Any, version: int) -> None:
        """Ships the weights (as host arrays) to the actor and waits until it has queued the swap."""
        import jax  # noqa: PLC0415

        host = state if isinstance(state, self._ray.ObjectRef) else jax.device_get(_as_state(state))
        self._answer(self.actor.update_weights.remote(host, int(version)), self.call_timeout_s)

    def wait_published(self, timeout_s: float | None = None) -> bool:
        """`Engine.wait_published` in the actor (the call itself bounded by `call_timeout_s`
        more than `timeout_s`)."""
        limit = None if timeout_s is None else timeout_s + self.call_timeout_s
        return bool(self._answer(self.actor.wait_published.remote(timeout_s), limit))

    @property
    def policy_version(self) -> int:
        return int(self._answer(self.actor.policy_version.remote(), self.call_timeout_s))

    def stats(self) -> Any:
        return self._answer(self.actor.stats.remote(), self.call_timeout_s)

    def _answer(self, ref: Any, timeout: float | None) -> Any:
        """The result of a control call (`ray.get` bounded by `timeout`); an answer marks the
        replica `up`."""
        out = self._ray.get(ref, timeout=timeout)
        self.up = True
        return out

    def __repr__(self) -> str:
        return f"RayEngineReplica(actor {self.actor._actor_id.hex()[:12]})"

    def heartbeat(self) -> Any:
        """An `ObjectRef` of `(policy_version, progress, resolved)`; the router's watchdog polls it."""
        return self.actor.heartbeat.remote()

    def kill(self) -> None:
        """Ends the actor at once (a replica dropped as stuck may never answer a shutdown)."""
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass

    def shutdown(self) -> None:
        try:
            self._ray.get(self.actor.shutdown.remote(), timeout=self.call_timeout_s)
        except Exception:  # noqa: BLE001 - already dead
            pass
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass
