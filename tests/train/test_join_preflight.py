"""Joining several processes fails fast and says why (train/_preflight.py): real sockets in
threads for every case, and real `agentax train` processes for the one-line errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from agentax.train import JoinError
from agentax.train._preflight import preflight


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _meet(specs, timeout_s=3.0):
    """Runs preflight(addr, count, id) for each (count, id) in a thread; returns errors by spec."""
    addr = f"127.0.0.1:{_port()}"
    out: dict[int, str | None] = {}

    def one(k, count, pid):
        try:
            preflight(addr, count, pid, timeout_s)
            out[k] = None
        except JoinError as e:
            out[k] = str(e)

    threads = [threading.Thread(target=one, args=(k, *spec)) for k, spec in enumerate(specs)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(30)
    return [out.get(k) for k in range(len(specs))], time.monotonic() - t0, addr


def test_every_process_there_passes():
    errors, took, _ = _meet([(3, 0), (3, 2), (3, 1)])
    assert errors == [None, None, None] and took < 3


def test_a_wrong_count_names_both_counts():
    errors, took, _ = _meet([(2, 0), (3, 1)])
    assert all(e and "--num-processes 3" in e and "process 0 with 2" in e for e in errors), errors
    assert took < 3


def test_clashing_ids_name_the_id():
    errors, _, _ = _meet([(3, 0), (3, 1), (3, 1)])
    assert errors[0] and "two processes were started with --process-id 1" in errors[0]
    assert any(e and "--process-id 1" in e for e in errors[1:])


def test_missing_processes_are_named_after_the_timeout():
    errors, took, addr = _meet([(3, 0), (3, 1)], timeout_s=1.0)
    assert errors[0] and "2 of 3 processes joined" in errors[0] and "[2]" in errors[0] and addr in errors[0]
    assert 1.0 <= took < 5


def test_no_coordinator_is_named_with_its_address():
    errors, took, addr = _meet([(2, 1)], timeout_s=1.0)
    assert errors[0] and f"no coordinator answered at {addr}" in errors[0] and took < 5


@pytest.mark.slow  # three fresh processes importing JAX: ~10-30 s on 2 cores
def test_agentax_train_with_clashing_ids_exits_with_one_line_each(tmp_path):
    """Real processes: process 0 and two process 1s; every process exits 1 within the join
    timeout with one `agentax train: error:` line, nothing on stdout."""
    port = _port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    base = [sys.executable, "-m", "agentax", "train", f"run.runs_dir={tmp_path}",
            "--coordinator", f"127.0.0.1:{port}", "--num-processes", "3", "--join-timeout", "20"]
    t0 = time.monotonic()
    procs = []
    for pid in (0, 1, 1):
        procs.append(subprocess.Popen([*base, "--process-id", str(pid)], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        time.sleep(0.3)
    outs = [p.communicate(timeout=120) for p in procs]
    took = time.monotonic() - t0
    lines = [[ln for ln in err.splitlines() if ln.strip()] for _, err in outs]
    assert [p.returncode for p in procs] == [1, 1, 1], lines
    assert took < 60
    for (out, _), errs in zip(outs, lines):
        assert out == "" and len(errs) == 1 and errs[0].startswith("agentax train: error:"), errs
    assert "two processes were started with --process-id 1" in lines[0][0]
    assert not any(tmp_path.glob("*/config.yaml"))  # no run directory was started
