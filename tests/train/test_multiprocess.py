"""The trainer as 2 real processes x 4 CPU devices (JAX's multi-controller runtime, gloo
collectives, coordinator on 127.0.0.1) against 1 process x 8 devices, same mesh
(data=2 x fsdp=2 x tensor=2), same global batch.

Each run is tests/train/multiprocess_worker.py in fresh subprocesses (a process's device
count is fixed at start-up). The 2-process runs feed each process half of the batch; the
results (loss, gradient norm, updated parameters, Adam's first moment = 0.1 x the gradient)
must equal the 1-process run's within 1e-6, on both processes; checkpoints cross process
counts both ways.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.compile_flags import fast_compile_xla_flags

pytestmark = pytest.mark.slow  # four launches of fresh JAX processes: ~3 min on two cores

WORKER = Path(__file__).with_name("multiprocess_worker.py")
TOL = 1e-6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(mode: str, out: Path, checkpoint: Path, processes: int) -> list[dict]:
    """Runs the worker as `processes` processes; returns each one's results."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=fast_compile_xla_flags(
                   f"--xla_force_host_platform_device_count={8 // processes}"))
    base = [sys.executable, str(WORKER), mode, str(out), "--checkpoint", str(checkpoint)]
    if processes == 1:
        commands = [base]
    else:
        port = _free_port()
        commands = [base + ["--coordinator", f"127.0.0.1:{port}", "--num-processes",
                            str(processes), "--process-id", str(i)] for i in range(processes)]
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for c in commands]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, log) in enumerate(zip(procs, logs)):
        lines = [ln for ln in log.splitlines()
                 if "[Gloo]" not in ln and "spmd_partitioner" not in ln]
        assert p.returncode == 0, f"process {i} of {processes} failed:\n" + "\n".join(lines[-40:])
    return [dict(np.load(out / f"process_{i}.npz")) for i in range(processes)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """1 process and 2 processes: an RL step (then a checkpoint) and an SFT step each."""
    root = tmp_path_factory.mktemp("multiprocess")
    return {1: _launch("train", root / "train1", root / "ckpt1", 1),
            2: _launch("train", root / "train2", root / "ckpt2", 2), "root": root}


def _assert_equal_results(one: dict, other: dict, prefix: str, tol: float = TOL) -> int:
    keys = sorted(k for k in one if k.startswith(prefix) and "_local_" not in k)
    assert keys and keys == sorted(k for k in other
                                   if k.startswith(prefix) and "_local_" not in k)
    for k in keys:
        np.testing.assert_allclose(other[k], one[k], rtol=0, atol=tol, err_msg=k)
    return len(keys)


@pytest.mark.parametrize("phase", ["rl", "sft"])
def test_two_processes_take_the_same_step_as_one(runs, phase):
    one, (p0, p1) = runs[1][0], runs[2]
    assert int(p0["process_count"]) == 2 and int(one["process_count"]) == 1
    # Each process fed half of the batch, the global step saw all of it.
    share = "rl_local_groups" if phase == "rl" else "sft_local_examples"
    assert int(p0[share]) + int(p1[share]) == int(one[share]) and int(p0[share]) < int(one[share])
    assert int(p0[f"{phase}_data_position"]) == int(one[f"{phase}_data_position"])
    assert abs(float(one[f"{phase}_loss"])) > 0 and float(one[f"{phase}_grad_norm"]) > 0
    for proc in (p0, p1):  # every process holds the same result as the 1-process run
        n = _assert_equal_results(one, proc, f"{phase}_")
        assert n > 20  # loss, grad norm, every parameter and optimizer leaf
    # Adam's first moment after one update is (1 - b1) x the (clipped) gradient.
    mu = [k for k in one if k.startswith(f"{phase}_opt") and ".mu" in k]
    assert mu and any(np.abs(one[k]).max() > 0 for k in mu)


def test_save_pretrained_from_two_processes_equals_one(runs):
    from safetensors.numpy import load_file

    root = runs["root"]
    one = load_file(root / "train1" / "hf" / "model.safetensors")
    two = load_file(root / "train2" / "hf" / "model.safetensors")
    assert sorted(one) == sorted(two) and len(one) > 5
    for name in one:  # the same trained weights, gathered tensor by tensor
        np.testing.assert_allclose(two[name].astype(np.float32), one[name].astype(np.float32),
                                   rtol=0, atol=TOL, err_msg=name)
    # ...and they are the updated parameters the trainer reports.
    q = next(k for k in runs[1][0] if k.startswith("rl_params") and "q_proj" in k)
    hf_q = next(k for k in one if "q_proj.weight" in k)
    np.testing.assert_allclose(one[hf_q].T.astype(np.float32), runs[1][0][q], atol=TOL)


def test_checkpoint_from_two_processes_restores_in_one_and_back(runs):
    root = runs["root"]
    saved_by = {1: runs[1][0], 2: runs[2][0]}
    # Restore each checkpoint under the other process count.
    restored = {1: _launch("restore", root / "restore1", root / "ckpt2", 1)[0],
                2: _launch("restore", root / "restore2", root / "ckpt1", 2)}
    for procs, result in ((1, restored[1]), (2, restored[2][0]), (2, restored[2][1])):
        source = saved_by[2 if procs == 1 else 1]
        assert int(result["restored_step"]) == 1
        for kind in ("params", "opt"):
            keys = [k for k in source if k.startswith(f"rl_{kind}")]
            assert keys
            for k in keys:  # bit for bit
                np.testing.assert_array_equal(result["restored_" + k[3:]], source[k], err_msg=k)
    # And the next step from the restored state agrees across process counts.
    _assert_equal_results(restored[1], restored[2][0], "rl_")
    _assert_equal_results(restored[1], restored[2][1], "rl_")
    assert int(restored[1]["rl_step_count"]) == 2
