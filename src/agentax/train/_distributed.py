"""Multi-controller training: one process per host on JAX's own runtime (`jax.distributed`).

Every process runs the same program. `initialize_distributed` joins the processes (before
anything touches a device); each then builds the same mesh over `jax.devices()` (all hosts'
devices), and the trainer's jitted step is one global SPMD program.

Data: a trainer step takes *this process's share* of the batch (its own groups or examples);
`gather_objects` hands every process all shares, in process order, with two fixed-shape
all-gathers (the byte lengths, then the padded bytes), so every process lays out the same
global micro-batches on its host (token ids and masks: small), and puts only the rows of its
own devices on them (`put_global`). Results that span processes come back to the host through
`to_host` (an all-gather where the array is not fully replicated).

Deadlock freedom: every function here that communicates is called by every process the same
number of times with the same shapes; the trainers call them unconditionally (also in a single
process, where they return at once), never behind a per-process condition.

Drift: between two steps each process does its own work (rollouts, evaluation) for its own
time, but a device collective (gloo on CPU) gives up when a peer is more than ~30 s late in
setting it up. So each entry into collectives (`gather_objects`, `barrier`, `sync`) first
meets the other processes at a barrier of JAX's coordination service, which waits as long as
`BARRIER_TIMEOUT_S` (and fails at once when a peer has died).
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

__all__ = ["initialize_distributed", "is_multiprocess", "process_index", "process_count",
           "is_main_process", "broadcast_from_main", "gather_objects", "local_share",
           "put_global", "sync", "to_host", "BARRIER_TIMEOUT_S"]

log = logging.getLogger(__name__)

_ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"  # JAX reads this one itself too
_ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
_ENV_PROCESS_ID = "JAX_PROCESS_ID"
_ENV_AUTO = "AGENTAX_DISTRIBUTED"  # "1": let JAX detect the cluster (Slurm, K8s, TPU, MPI)

_initialized = False
_barriers = 0  # barriers passed so far: every process counts the same, so names match

BARRIER_TIMEOUT_S = 3600.0
"""How long a process waits at a barrier for the slowest one (its rollouts, its evaluation)."""


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be an integer") from None


def _cluster_detected() -> bool:
    """A launcher that starts several tasks of this program (JAX then finds the rest)."""
    # A step `srun` started with several tasks (JAX reads the same variables; a batch
    # script itself has no SLURM_STEP_NODELIST).
    if (_env_int("SLURM_NTASKS") or 0) > 1 and "SLURM_STEP_NODELIST" in os.environ:
        return True
    return (_env_int("OMPI_COMM_WORLD_SIZE") or 0) > 1


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None,
                           *, auto: bool | None = None, timeout_s: float = 60.0,
                           heartbeat_timeout_s: int = 30) -> bool:
    """Joins this process to a multi-process JAX job; returns whether it is one.

    Call it first, before anything touches a device (building a model, `jax.devices()`).
    The coordinator comes from the arguments, else from the environment: JAX_COORDINATOR_ADDRESS
    with JAX_NUM_PROCESSES and JAX_PROCESS_ID, else from the cluster the way JAX finds it
    (Slurm under `srun` with several tasks, Open MPI; with `auto=True` or AGENTAX_DISTRIBUTED=1
    also Kubernetes and TPU pods). Nothing set: a single process, nothing done. On CPU the
    cross-process collectives use gloo.

    Args:
      coordinator_address: "HOST:PORT" of process 0's coordinator service.
      num_processes: processes in the job.
      process_id: this process's index, 0 .. num_processes - 1.
      auto: force (True) or skip (False) JAX's cluster detection when no address is given.
      timeout_s: how long to wait for every process to join. With an explicit address the
        processes first meet in `preflight` (`_preflight.py`), which fails within this time
        naming the coordinator, the counts and any duplicate or missing ids.
      heartbeat_timeout_s: how long JAX's coordination service waits for a silent peer
        (a lost host) before ending the others. A peer whose process ends (killed, crashed)
        stops the others within a second: with an explicit address, the pre-flight's
        connections stay open and are watched (`_liveness.py`).
    Raises:
      ValueError: an address without a process count and index (or the reverse).
      JoinError: the processes could not be joined (the message says why).
    """
    global _initialized
    if _initialized:
        return jax.process_count() > 1
    coordinator_address = coordinator_address or os.environ.get(_ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _env_int(_ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _env_int(_ENV_PROCESS_ID)
    explicit = coordinator_address is not None
    if explicit and (num_processes is None or process_id is None):
        raise ValueError(f"coordinator {coordinator_address} given without the number of "
                         "processes and this process's index: pass --num-processes N "
                         "--process-id I (or set JAX_NUM_PROCESSES and JAX_PROCESS_ID)")
    if not explicit and (num_processes is not None or process_id is not None):
        raise ValueError("--num-processes / --process-id need a coordinator: pass "
                         "--coordinator HOST:PORT (or set JAX_COORDINATOR_ADDRESS)")
    if auto is None:
        auto = os.environ.get(_ENV_AUTO, "") not in ("", "0") or _cluster_detected()
    if not explicit and not auto:
        return False
    if explicit and num_processes == 1:
        return False
    if explicit and not 0 <= process_id < num_processes:
        raise ValueError(f"process id {process_id} is outside 0..{num_processes - 1}")
    if timeout_s <= 0:
        raise ValueError(f"the join timeout must be > 0 s, got {timeout_s}")
    peers = None
    if explicit:
        from agentax.train._preflight import preflight

        peers = preflight(coordinator_address, num_processes, process_id, timeout_s)
    # CPU collectives across processes need an implementation; GPU/TPU ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id,
                                   initialization_timeout=max(1, int(timeout_s)),
                                   heartbeat_timeout_seconds=heartbeat_timeout_s)
    except BaseException:
        for conn in (peers or ({}, {}))[0].values():
            conn.close()
        raise
    _initialized = True
    if peers is not None:  # a peer that dies stops this process at once (`_liveness.py`)
        from agentax.train._liveness import watch_peers

        watch_peers(process_id, *peers)
    log.info("process %d of %d: %d local devices, %d in all", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())
    return jax.process_count() > 1


def is_multiprocess() -> bool:
    """More than one JAX process in this job."""
    return jax.process_count() > 1


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_main_process() -> bool:
    """Process 0: the one that writes metrics, the console and the run directory."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """Waits until every process has reached its `sync` of the same count (nothing in a single
    process), on the coordination service: no device collective, so no 30 s limit."""
    global _barriers
    if jax.process_count() == 1:
        return
    _barriers += 1
    from jax._src import distributed  # the runtime's client: its key-value barrier

    client = distributed.global_state.client
    if client is None:  # not started by jax.distributed (e.g. a TPU pod runtime)
        return
    client.wait_at_barrier(f"agentax/{_barriers}/{name}", int(BARRIER_TIMEOUT_S * 1000))


def gather_objects(local: Sequence[Any]) -> list[Any]:
    """Every process's `local` items (picklable), concatenated in process order; `local`
    itself in a single process. A collective: every process must call it, once per call on
    the others."""
    if jax.process_count() == 1:
        return list(local)
    from jax.experimental import multihost_utils

    sync("gather")  # a peer may be minutes behind (its rollouts): wait here, not in gloo
    blob = np.frombuffer(pickle.dumps(list(local), protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([blob.size], np.int64)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:blob.size] = blob
    blobs = np.asarray(multihost_utils.process_allgather(padded))  # [P, max]
    out: list[Any] = []
    for row, size in zip(blobs, sizes.reshape(-1)):
        out.extend(pickle.loads(row[:int(size)].tobytes()))
    return out


def broadcast_from_main(value: Any) -> Any:
    """Process 0's `value` (picklable) on every process; `value` in a single process. A
    collective: every process must call it."""
    if jax.process_count() == 1:
        return value
    return gather_objects([value])[0]


def local_share(items: Sequence[Any]) -> list[Any]:
    """This process's contiguous share of `items` (the first processes get one more when it
    does not divide): `gather_objects` of every process's share is `items` again."""
    n, p, i = len(items), jax.process_count(), jax.process_index()
    start = i * (n // p) + min(i, n % p)
    return list(items[start:start + n // p + (i < n % p)])


def put_global(tree, sharding: Sharding):
    """`tree` (host arrays, identical on every process; or device arrays) on `sharding`.

    A sharding that spans processes gets from each process only the slices of that
    process's own devices (`jax.make_array_from_callback`); a global array is resharded."""
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
    return jax.tree.map(one, tree)


def to_host(tree):
    """`jax.device_get` that also reads arrays spanning processes (all-gathered when not
    fully replicated: a collective then, called by every process)."""
    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return jax.device_get(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.tree.map(one, tree)
