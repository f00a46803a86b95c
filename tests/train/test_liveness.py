"""`_liveness.py` with real processes (no JAX join: the pre-flight's connections alone): a
peer killed with SIGKILL, one that fails, one that leaves, and process 0's relay to the rest."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

WORKER = """
import sys, time
from agentax.train._preflight import preflight
from agentax.train import _liveness
addr, n, me, then = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
_liveness.watch_peers(me, *preflight(addr, n, me, 20))
_liveness.set_resume_hint(lambda: "Resume from X.")
print("joined", flush=True)
if then == "leave":
    _liveness.leave_job()
    sys.exit(0)
if then == "fail":
    time.sleep(1)  # the others have said "joined"
    _liveness.fail_job("ValueError")
    sys.exit(1)
time.sleep(float(then))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(plan: list[str]) -> list[subprocess.Popen]:
    addr = f"127.0.0.1:{_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, addr, str(len(plan)), str(i), then],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, then in enumerate(plan)]
    for p in procs:
        assert p.stdout.readline().strip() == "joined", p.stderr.read()
    return procs


def _finish(procs, timeout=30.0):
    out = []
    for p in procs:
        try:
            out.append((p.wait(timeout), p.stderr.read().strip()))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_a_killed_peer_stops_every_survivor_with_one_line():
    procs = _start(["60", "60", "60"])
    os.kill(procs[1].pid, signal.SIGKILL)
    t0 = time.monotonic()
    (rc0, err0), _, (rc2, err2) = _finish(procs)
    assert time.monotonic() - t0 < 5
    assert rc0 == rc2 == 1
    # Process 0 saw the connection end; process 2 heard it from process 0.
    assert err0 == (f"agentax: process 1 (pid {procs[1].pid} on {socket.gethostname()}) died: "
                    "this process (0) stops. Resume from X."), err0
    assert err2.startswith(f"agentax: process 1 (pid {procs[1].pid} on") and err2.endswith(
        "died: this process (2) stops. Resume from X."), err2


def test_a_killed_process_0_stops_the_others():
    procs = _start(["60", "60"])
    os.kill(procs[0].pid, signal.SIGKILL)
    _, (rc1, err1) = _finish(procs)
    assert rc1 == 1 and err1.startswith(f"agentax: process 0 (pid {procs[0].pid} on"), err1


def test_a_failed_peer_stops_the_others_and_one_that_leaves_does_not():
    procs = _start(["60", "fail", "60"])
    (rc0, err0), (rc1, _), (rc2, err2) = _finish(procs)
    assert rc0 == rc1 == rc2 == 1
    assert "process 1 (pid" in err0 and "failed (ValueError; its own log says more)" in err0
    assert "process 1 (pid" in err2 and "this process (2) stops" in err2

    procs = _start(["1.5", "leave"])
    t0 = time.monotonic()
    (rc0, err0), (rc1, _) = _finish(procs)
    assert rc0 == rc1 == 0 and err0 == "" and time.monotonic() - t0 > 1.0
