"""agentax.train's multi-process helpers in one process: what `initialize_distributed` accepts,
and that the data helpers are the identity there (the 2-process behaviour is
tests/train/test_multiprocess.py)."""

from __future__ import annotations

import numpy as np
import pytest

from agentax.train import initialize_distributed, local_share
from agentax.train._distributed import gather_objects, put_global, to_host

_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "AGENTAX_DISTRIBUTED",
        "SLURM_NTASKS", "SLURM_STEP_NODELIST", "OMPI_COMM_WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


def test_nothing_set_is_one_process(clean_env, monkeypatch):
    assert initialize_distributed() is False
    # An sbatch script itself (no srun step): not a multi-process job.
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert initialize_distributed() is False
    assert initialize_distributed("127.0.0.1:1", 1, 0) is False  # one process: nothing to join


@pytest.mark.parametrize("kwargs, message", [
    (dict(coordinator_address="127.0.0.1:1"), "--num-processes N --process-id I"),
    (dict(coordinator_address="127.0.0.1:1", num_processes=2), "--num-processes N"),
    (dict(num_processes=2, process_id=0), "--coordinator HOST:PORT"),
    (dict(coordinator_address="127.0.0.1:1", num_processes=2, process_id=2), "outside 0..1"),
])
def test_incomplete_coordinates_say_what_is_missing(clean_env, kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        initialize_distributed(**kwargs)


def test_environment_is_read(clean_env, monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' must be an integer"):
        initialize_distributed()


def test_single_process_helpers_are_the_identity():
    import jax

    items = list(range(7))
    assert local_share(items) == items and gather_objects(items) == items
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    placed = put_global(host, sharding)
    assert placed.sharding == sharding
    np.testing.assert_array_equal(to_host(placed), host)
