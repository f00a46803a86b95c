"""Weight publication to Ray engine replicas: one shared transfer, chunked, parallel, bounded.

The serial path (`RayEngineReplica.update_weights`, one replica after another) copies the
whole state device->host and through the object store once *per replica*. `WeightSync`
instead:

1. **stages** the state on the trainer's thread: each tensor cast to the engine's dtype on
   its device (fewer bytes cross PCIe), then one device->host copy. This is the only part
   the trainer waits for (`background=True`).
2. **streams** it from a background thread in chunks of about `chunk_bytes` (a chunk packs
   small tensors together and splits large ones at element boundaries): one `ray.put` per
   chunk, read by every replica (the object store moves it once per node, not once per
   replica), all replicas receiving in parallel, at most `max_chunks_in_flight` chunks
   outstanding (bounded object-store memory).
3. **commits**: the call that brings a replica the last chunk of a version also hands the
   assembled weights to its engine in one `update_weights` (the engine swaps between two
   decode steps) and returns once the engine has swapped them in, so a publication costs no
   extra round trip, and a committed version is the one each replica decodes with.

With `delta=True` only the chunks whose bytes changed since the last publication travel
(the replicas patch a copy of their previous host weights); a publication where every chunk
changed is sent in full. The background queue holds one version: a newer one supersedes a
pending, not yet started one (counted), so the trainer never waits for the network and host
memory stays bounded (the version being sent, the pending one, and the delta baseline).

Every wait is bounded: a replica that does not take a chunk within `chunk_timeout_s`, or
commit within `commit_timeout_s`, or that dies, is handed to `on_lost(index, stage, reason,
detail)` (the router drops it) and the publication goes on with the others. When none is
left, the publication fails with `RunFailed` naming the replica and the stage.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agentax.trace import get_tracer, names

__all__ = ["WeightLayout", "WeightSync", "WeightSyncConfig", "WeightSyncStats"]

log = logging.getLogger(__name__)

Range = tuple[int, int, int]  # (leaf index, first element, end element) of a flat leaf


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightSyncConfig:
    """How `EngineRouter` publishes weights to Ray engine replicas."""

    chunk_bytes: int = 128 << 20
    """Bytes per object-store chunk (small tensors are packed together, large ones split)."""
    max_chunks_in_flight: int = 4
    """Chunks put but not yet taken by every replica (bounds object-store memory)."""
    delta: bool = False
    """Send only the chunks that changed since the last publication (when any did not)."""
    background: bool = True
    """Return after the device->host copy and stream from a background thread; False
    returns only once every replica has committed."""
    chunk_timeout_s: float = 60.0
    """A replica that has not taken a chunk this long after it was sent is dropped."""
    commit_timeout_s: float = 60.0
    """Added to `chunk_timeout_s` for the last chunks (whose calls also commit)."""

    def __post_init__(self) -> None:
        if self.chunk_bytes < 1024:
            raise ValueError(f"weight_sync.chunk_bytes must be >= 1024, got {self.chunk_bytes}")
        if self.max_chunks_in_flight < 1:
            raise ValueError(
                f"weight_sync.max_chunks_in_flight must be >= 1, got {self.max_chunks_in_flight}")
        if min(self.chunk_timeout_s, self.commit_timeout_s) <= 0:
            raise ValueError("weight_sync.chunk_timeout_s and commit_timeout_s must be > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightSyncStats:
    """Counters of a `WeightSync`."""

    publications: int
    """Publications committed by every live replica."""
    delta_publications: int
    """Of those, sent as deltas."""
    superseded: int
    """Versions replaced in the queue by a newer one before they were sent."""
    bytes_put: int
    """Bytes put into the object store (once per chunk, whatever the replica count)."""
    last_publish_s: float
    """Seconds from `publish` to the last replica's commit, for the last publication."""
    last_stage_s: float
    """Seconds the caller was blocked (cast + device->host copy) in the last `publish`."""
    committed_version: int | None


@dataclasses.dataclass(frozen=True)
class WeightLayout:
    """The engine's flat weights and how they are cut into chunks.

    Attributes:
      shapes / dtypes: each leaf of the engine's state, in `jax.tree.leaves` order.
      chunks: per chunk, the element ranges of flattened leaves it carries.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype, ...]
    chunks: tuple[tuple[Range, ...], ...]

    @classmethod
    def from_spec(cls, spec: Sequence[tuple[Sequence[int], Any]], chunk_bytes: int) -> WeightLayout:
        """Cuts leaves `(shape, dtype)` into chunks of at most `chunk_bytes` (or one element).

        A leaf that fits in a chunk is never split (a replica puts it on its device straight
        from the object store, one copy); a larger one fills whole chunks of its own.
        """
        shapes = tuple(tuple(int(d) for d in shape) for shape, _ in spec)
        dtypes = tuple(np.dtype(_np_dtype(dtype)) for _, dtype in spec)
        chunks: list[tuple[Range, ...]] = []
        current: list[Range] = []
        room = chunk_bytes

        def close() -> None:
            nonlocal current, room
            if current:
                chunks.append(tuple(current))
            current, room = [], chunk_bytes

        for leaf, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            size = int(np.prod(shape, dtype=np.int64))
            nbytes = size * dtype.itemsize
            if nbytes <= chunk_bytes:
                if nbytes > room:
                    close()
                current.append((leaf, 0, size))
                room -= nbytes
                continue
            close()
            per = max(chunk_bytes // dtype.itemsize, 1)
            for start in range(0, size, per):
                chunks.append(((leaf, start, min(start + per, size)),))
        close()
        return cls(shapes, dtypes, tuple(chunks))

    @property
    def total_bytes(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in zip(self.shapes, self.dtypes))

    def chunk_bytes(self, chunk: int) -> int:
        return sum((b - a) * self.dtypes[leaf].itemsize for leaf, a, b in self.chunks[chunk])


def _np_dtype(dtype: Any) -> Any:
    """A numpy dtype from a name ('bfloat16' needs ml_dtypes, which JAX brings)."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return ml_dtypes.bfloat16
    return dtype


def stage_host(state: Any, layout: WeightLayout) -> list[np.ndarray]:
    """Flat host copies of `state`'s leaves in the engine's dtypes (cast on device first).

    Args:
      state: an `nnx.Module`, its `nnx.State`, any pytree with the engine's leaves, or the
        flat list of leaves.
      layout: the engine's layout.

    Returns:
      One 1-D numpy array per leaf.

    Raises:
      ValueError: leaf count or a shape differs from the engine's.
    """
    import jax  # noqa: PLC0415 - see the module docstring of _router
    from flax import nnx  # noqa: PLC0415

    if isinstance(state, nnx.Module):
        state = nnx.state(state)
    leaves = state if isinstance(state, list) else jax.tree.leaves(state)
    if len(leaves) != len(layout.shapes):
        raise ValueError(
            f"update_weights: the state has {len(leaves)} leaves, the engine {len(layout.shapes)}; "
            "pass the state of the engine's architecture (nnx.split(model))")
    cast = []
    for i, (x, shape, dtype) in enumerate(zip(leaves, layout.shapes, layout.dtypes)):
        if tuple(x.shape) != shape:
            raise ValueError(f"update_weights: leaf {i} has shape {tuple(x.shape)}, the engine's {shape}")
        if x.dtype != dtype:
            x = x.astype(dtype)  # on the trainer's device: fewer bytes cross to the host
        cast.append(x)
    host = jax.device_get(cast)  # one batched device->host copy
    return [np.ascontiguousarray(h).reshape(-1) for h in host]


def _changed(new: list[np.ndarray], old: list[np.ndarray], ranges: Sequence[Range]) -> bool:
    """Whether any byte of a chunk differs (bitwise: NaNs compare equal to themselves)."""
    for leaf, a, b in ranges:
        x, y = new[leaf][a:b], old[leaf][a:b]
        if not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
            return True
    return False


LostFn = Callable[[int, str, str, str], None]


def run_failed(cause: str, message: str, **kw: Any) -> Exception:
    """`agentax.pipeline.RunFailed`, imported on use (the pipeline pulls in JAX; environment
    actors import `agentax.scale` without it)."""
    from agentax.pipeline import RunFailed  # noqa: PLC0415

    return RunFailed(cause, message, **kw)


class WeightSync:
    """Publishes host-staged weights to Ray engine replicas (see the module docstring).

    Args:
      replicas: `RayEngineReplica`s, indexed as in the router.
      config: chunking, delta, background and timeouts.
      live: returns the indices of the replicas still in rotation.
      on_lost: `(index, stage, reason, detail)`, called when a replica fails a publication.
      lost_line: one line naming the dropped replicas and their stages (for `RunFailed`).
      control_timeout_s: bound on the one-time `weight_spec` call.
    """

    def __init__(self, replicas: Sequence[Any], config: WeightSyncConfig, *,
                 live: Callable[[], list[int]], on_lost: LostFn, lost_line: Callable[[], str],
                 control_timeout_s: float = 60.0):
        from agentax.scale._ray import require_ray  # noqa: PLC0415

        self._ray = require_ray()
        self.replicas = tuple(replicas)
        self.config = config
        self._live = live
        self._on_lost = on_lost
        self._lost_line = lost_line
        self._control_timeout_s = control_timeout_s
        self.layout: WeightLayout | None = None
        self._cond = threading.Condition()
        self._pending: tuple[list[np.ndarray], int, float] | None = None
        self._busy = False
        self._error: Exception | None = None  # a RunFailed
        self._baseline: tuple[list[np.ndarray], int] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._counts = dict(publications=0, delta_publications=0, superseded=0, bytes_put=0)
        self._last_publish_s = self._last_stage_s = 0.0
        self._committed: int | None = None

    # ------------------------------------------------------------------ trainer side

    def publish(self, state: Any, version: int) -> None:
        """Stages `state` (blocking: cast + device->host) and sends it (in the background).

        Raises:
          RunFailed: no replica is left (this or an earlier background publication lost the
            last one); the message names the replica and the stage.
        """
        self._fail_if_empty(self._live(), "publish")
        self._raise_error()
        t0 = time.perf_counter()
        layout = self._layout()
        host = stage_host(state, layout)
        self._last_stage_s = time.perf_counter() - t0
        if not self.config.background:
            self._send(host, int(version), t0)
            self._raise_error()
            return
        with self._cond:
            if self._pending is not None:
                self._counts["superseded"] += 1
            self._pending = (host, int(version), t0)
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._worker, name="agentax-weight-sync",
                                                daemon=True)
                self._thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Blocks until the queue is drained (True) or `timeout_s` passed (False).

        Raises:
          RunFailed: the background publication lost every replica.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        self._raise_error()
        return True

    def close(self) -> None:
        """Stops the background thread (a publication in progress finishes its current wait)."""
        with self._cond:
            self._closed = True
            self._pending = None
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def forget_baseline(self) -> None:
        """The replicas got weights another way (the serial path): the next publication is full."""
        self._baseline = None

    def stats(self) -> WeightSyncStats:
        return WeightSyncStats(**self._counts, last_publish_s=self._last_publish_s,
                               last_stage_s=self._last_stage_s, committed_version=self._committed)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _layout(self) -> WeightLayout:
        """The engines' leaf shapes and dtypes, asked once (every live replica must agree)."""
        if self.layout is not None:
            return self.layout
        specs = {}
        for i in self._live():
            ref = self.replicas[i].actor.weight_spec.remote()
            ready, _ = self._ray.wait([ref], timeout=self._control_timeout_s)
            if not ready:
                self._lost(i, "weight_spec", "replica_stuck",
                           f"no answer within {self._control_timeout_s:g} s")
                continue
            try:
                specs[i] = self._ray.get(ref)
            except Exception as e:  # noqa: BLE001 - an actor that died or failed is dropped
                self._lost(i, "weight_spec", "replica_died", f"{type(e).__name__}: {e}")
        self._fail_if_empty(list(specs), "weight_spec")
        self._raise_error()
        first = next(iter(specs.values()))
        for i, spec in specs.items():
            if spec != first:
                raise ValueError(f"replica {i}'s engine weights differ in shape or dtype from the "
                                 "others'; all replicas of a router must serve the same model")
        self.layout = WeightLayout.from_spec(first, self.config.chunk_bytes)
        return self.layout

    # ------------------------------------------------------------------ background

    def _worker(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                (host, version, t0), self._pending = self._pending, None
                self._busy = True
            try:
                self._send(host, version, t0)
            except Exception as e:  # noqa: BLE001 - a bug must not hang the trainer's wait()
                log.exception("weight publication of version %d failed", version)
                self._error = self._error or run_failed(
                    "weight_sync", f"publishing version {version} raised",
                    sample_error=f"{type(e).__name__}: {e}", knob="report it with the traceback")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, host: list[np.ndarray], version: int, t0: float) -> None:
        """Streams one version to every live replica and commits it there."""
        layout, cfg = self.layout, self.config
        targets = [i for i in self._live()]
        if not targets:
            return self._fail_if_empty(targets, "publish")
        chunks = range(len(layout.chunks))
        base = self._baseline if cfg.delta else None
        if base is not None:
            changed = [c for c in chunks if _changed(host, base[0], layout.chunks[c])]
            if len(changed) < len(layout.chunks):
                chunks = changed
            else:
                base = None  # everything changed: a full publication is no larger
        base_version = None if base is None else base[1]
        tracer = get_tracer()
        with tracer.span(names.WEIGHT_PUBLISH, track="weight_sync",
                         args={names.ARG_POLICY_VERSION: version, "chunks": len(chunks),
                               "delta": base is not None, "replicas": len(targets)}):
            inflight: deque[tuple[int, dict[int, Any]]] = deque()
            for c in chunks:
                ranges = layout.chunks[c]
                ref = self._ray.put([host[leaf][a:b] for leaf, a, b in ranges])
                self._counts["bytes_put"] += layout.chunk_bytes(c)
                inflight.append((c, {i: self.replicas[i].actor.receive_chunk.remote(
                    version, ranges, ref, base_version, cfg.delta, len(chunks)) for i in targets}))
                del ref  # the calls hold it; the object goes once every replica took it
                while len(inflight) >= cfg.max_chunks_in_flight:
                    c_done, calls = inflight.popleft()
                    self._settle(calls, cfg.chunk_timeout_s, f"publish (chunk {c_done})", targets)
            while inflight:  # these calls include the commit
                c_done, calls = inflight.popleft()
                self._settle(calls, cfg.chunk_timeout_s + cfg.commit_timeout_s,
                             f"publish (chunk {c_done} / commit)", targets)
            if not chunks:  # a delta in which nothing changed: only the version moves
                commits = {i: self.replicas[i].actor.commit_weights.remote(
                    version, base_version, cfg.delta) for i in targets}
                self._settle(commits, cfg.commit_timeout_s, "publish (commit)", targets)
        if not targets:
            return self._fail_if_empty(targets, "publish")
        self._baseline = (host, version) if cfg.delta else None
        self._committed = version
        self._counts["publications"] += 1
        self._counts["delta_publications"] += base is not None
        self._last_publish_s = time.perf_counter() - t0

    def _settle(self, calls: dict[int, Any], timeout_s: float, stage: str, targets: list[int]) -> None:
        """Waits (bounded) for one call per replica; drops the replicas that fail or hang."""
        refs = [r for i, r in calls.items() if i in targets]
        if not refs:
            return
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        ready_set = set(ready)
        for i, ref in calls.items():
            if i not in targets:
                continue
            if ref not in ready_set:
                targets.remove(i)
                self._lost(i, stage, "replica_stuck", f"no answer within {timeout_s:g} s")
                continue
            try:
                self._ray.get(ref)
            except Exception as e:  # noqa: BLE001 - died, or its engine refused the weights
                targets.remove(i)
                reason = "replica_died" if isinstance(e, self._ray.exceptions.RayActorError) else "replica_error"
                self._lost(i, stage, reason, f"{type(e).__name__}: {e}")
        self._fail_if_empty(targets, stage)

    def _lost(self, index: int, stage: str, reason: str, detail: str) -> None:
        self._on_lost(index, stage, reason, detail)
        self._fail_if_empty(self._live(), stage)

    def _fail_if_empty(self, targets: list[int], stage: str) -> None:
        if not targets and self._error is None:
            self._error = run_failed(
                "replicas_lost", f"no engine replica left to {stage}: {self._lost_line()}",
                knob="the replicas' logs (ray logs), or weight_sync.chunk_timeout_s / "
                "commit_timeout_s / the router's stuck_after_s")
