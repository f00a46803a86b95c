"""The router's watchdog: notices Ray engine replicas that stop answering or stop progressing.

A thread polls every live replica's `heartbeat` (an async actor method, so it answers
whenever the actor's event loop runs) every `probe_interval_s`:

* a probe unanswered for `stuck_after_s` (the actor's loop is blocked, its process hangs, its
  node is unreachable) drops the replica as `replica_stuck`;
* a replica with requests in flight whose engine made no progress (no decode step, no prefill,
  no request resolved) for `no_progress_after_s` is dropped as `replica_stuck` too: its event
  loop runs but generation does not (a hung `generate`, a deadlocked step thread, a wedged
  device). A compilation makes no progress either, so this bound is longer (default 120 s),
  and it starts after the replica's first resolved request (the first compilations are
  judged by the probe alone);
* a probe that fails because the actor died drops it as `replica_died`;
* until its first answer the replica is starting (importing, loading weights, building its
  engine): it is dropped as `replica_stuck` at stage 'start' only after `start_timeout_s`.
  A replica that answered before (`RayEngineReplica.up`: a call, or a probe of an earlier
  router) is not starting: its first probe is held to `stuck_after_s`.

Dropping is the router's `_drop`: out of rotation, in-flight requests re-run elsewhere, the
trace flushed, the actor killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any

__all__ = ["ReplicaWatchdog"]


@dataclasses.dataclass
class _Probe:
    ref: Any = None
    sent: float = 0.0
    progress: tuple[int, int] | None = None
    progress_at: float = 0.0
    warm: bool = False
    version: int | None = None
    answered: bool = False
    created: float = dataclasses.field(default_factory=time.monotonic)


class ReplicaWatchdog:
    """Polls the heartbeats of a router's Ray replicas (see the module docstring).

    Args:
      router: the `EngineRouter` (its `live_indices`, `inflight`, `_drop`).
      indices: the replicas that have a `heartbeat` (Ray replicas).
      stuck_after_s: how long a replica may leave a probe unanswered.
      no_progress_after_s: how long a replica may make no progress with requests in flight.
      probe_interval_s: seconds between two polls.
      start_timeout_s: how long a replica may take to answer its first probe.
    """

    def __init__(self, router: Any, indices: list[int], *, stuck_after_s: float,
                 no_progress_after_s: float, probe_interval_s: float,
                 start_timeout_s: float) -> None:
        from agentax.scale._ray import require_ray  # noqa: PLC0415

        self._ray = require_ray()
        self.router = router
        self.stuck_after_s = stuck_after_s
        self.no_progress_after_s = no_progress_after_s
        self.probe_interval_s = probe_interval_s
        self.start_timeout_s = start_timeout_s
        # A replica that answered before (another router's, an earlier call) is up already: a
        # probe it leaves unanswered counts from the first one, not from start_timeout_s.
        self._probes = {i: _Probe(answered=bool(getattr(router.replicas[i], "up", False)))
                        for i in indices}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="agentax-replica-watchdog",
                                        daemon=True)
        self._thread.start()

    def version_of(self, index: int) -> int | None:
        """The policy version the replica reported in its last heartbeat."""
        probe = self._probes.get(index)
        return None if probe is None else probe.version

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _watch(self) -> None:
        while not self._stop.wait(self.probe_interval_s):
            live = set(self.router.live_indices())
            for index, probe in self._probes.items():
                if index in live and not self._stop.is_set():
                    self._check(index, probe, time.monotonic())

    def _check(self, index: int, probe: _Probe, now: float) -> None:
        router, limit = self.router, self.stuck_after_s
        if probe.ref is None:
            probe.ref, probe.sent = router.replicas[index].heartbeat(), now
            if probe.progress is None:
                probe.progress_at = now
            return
        ready, _ = self._ray.wait([probe.ref], timeout=0)
        if not ready and not probe.answered:
            if now - probe.created > self.start_timeout_s:
                router._drop(index, "start", "replica_stuck",
                             f"not up after {now - probe.created:.1f} s (start_timeout_s="
                             f"{self.start_timeout_s:g})")
            return
        if not ready:
            if now - probe.sent > limit:
                router._drop(index, router.stage_of(index), "replica_stuck",
                             f"no answer to a health probe for {now - probe.sent:.1f} s "
                             f"(stuck_after_s={limit:g})")
            return
        try:
            version, progress, resolved = self._ray.get(probe.ref)
        except Exception as e:  # noqa: BLE001 - the actor died (or its engine cannot answer)
            router._drop(index, router.stage_of(index), "replica_died", f"{type(e).__name__}: {e}")
            return
        probe.ref, probe.version, probe.answered = None, int(version), True
        with contextlib.suppress(AttributeError):  # remembered by the replica for later routers
            router.replicas[index].up = True
        probe.warm |= resolved > 0
        busy = router.inflight(index) > 0
        if not busy or (progress, resolved) != probe.progress:
            probe.progress, probe.progress_at = (progress, resolved), now
        elif probe.warm and now - probe.progress_at > self.no_progress_after_s:
            router._drop(index, "generate", "replica_stuck",
                         f"{router.inflight(index)} requests in flight and no decode progress for "
                         f"{now - probe.progress_at:.1f} s (no_progress_after_s="
                         f"{self.no_progress_after_s:g})")
