"""A process of a 2-process `agentax train` killed (`kill -9`) mid-RL: the survivor exits 1
within 30 s with one line on stderr naming the dead process and the checkpoint to resume
from, nothing on stdout; the resumed run (both processes) logs every RL step once, in
metrics.jsonl and in process_1/metrics.jsonl (docs/scaling.md, "Faults")."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.compile_flags import fast_compile_xla_flags

pytestmark = pytest.mark.slow  # two demo runs of 2 processes each: ~4 min on 2 cores

STEPS = 8
TINY = [
    "sft.steps=1", "sft.batch_size=8", "sft.batch_tokens=0", "sft.num_demos=16",
    f"run.steps={STEPS}", "run.checkpoint_every=1",
    "tasks.num_train=64", "tasks.num_eval=2",
    "pipeline.group_size=2", "pipeline.groups_per_step=2", "pipeline.max_concurrency=8",
    "pipeline.filters=[]", "engine.max_slots=8", "eval.max_concurrency=8", "eval.samples=1",
    "tracing.console=false",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[str], cwd: Path) -> list[subprocess.Popen]:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=fast_compile_xla_flags("--xla_force_host_platform_device_count=2"))
    script = Path(sys.executable).with_name("agentax")
    command = ([str(script)] if script.exists() else
               [sys.executable, "-c", "import sys; from agentax.cli import main; "
                "sys.exit(main(sys.argv[1:]))"])
    port = _free_port()
    return [subprocess.Popen([*command, "train", *args, "--coordinator", f"127.0.0.1:{port}",
                              "--num-processes", "2", "--process-id", str(i)],
                             env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for i in range(2)]


def _reap(procs: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def _rl_steps(path: Path) -> list[int]:
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return [r["step"] for r in rows if r.get("phase") == "rl"]


def test_killed_peer_stops_the_survivor_and_the_resume_logs_each_step_once(tmp_path):
    run = tmp_path / "dead-peer"
    procs = _launch([*TINY, f"run.runs_dir={tmp_path}", "run.name=dead-peer",
                     "trainer.mesh={fsdp: 4}"], tmp_path)
    survivor, victim = procs
    try:
        deadline = time.monotonic() + 600
        while not (run / "checkpoints" / "step_2" / "meta.json").exists():
            assert time.monotonic() < deadline, "no checkpoint of step 2 within 600 s"
            if survivor.poll() is not None or victim.poll() is not None:
                ends = _reap(procs, 30)
                pytest.fail("a process ended before the kill:\n" + "\n".join(
                    f"process {i} ({p.returncode}): {e[-2000:]}"
                    for i, (p, (_, e)) in enumerate(zip(procs, ends))))
            time.sleep(0.2)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = survivor.communicate(timeout=60)
        stopped_s = time.monotonic() - killed
    finally:
        _reap(procs, 5)
    print(f"survivor stopped {stopped_s:.2f} s after the kill")
    assert survivor.returncode == 1, err[-3000:]
    assert stopped_s <= 30, stopped_s
    assert out == ""  # stdout: the JSON summary or nothing, never a log
    lines = [ln for ln in err.splitlines() if ln.startswith("agentax: ")]
    assert len(lines) == 1, err[-3000:]
    assert err.rstrip().splitlines()[-1] == lines[0]  # the last word; no C++ abort after it
    assert re.match(rf"agentax: process 1 \(pid {victim.pid} on .+\) died: this process \(0\) "
                    r"stops\. Resume from .+/checkpoints/step_\d+: agentax train .+dead-peer",
                    lines[0]), lines[0]
    assert "Traceback" not in err and "Check failure" not in err

    # Resume both processes: each RL step in the run's metrics and in process 1's, once.
    procs = _launch([str(run)], tmp_path)
    outs = _reap(procs, 900)
    for i, (p, (_, e)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"process {i} failed on resume:\n{e[-3000:]}"
    assert json.loads(outs[0][0])["run_dir"] == str(run)
    assert json.loads((run / "summary.json").read_text())["rl_steps"] == STEPS
    assert _rl_steps(run / "metrics.jsonl") == list(range(1, STEPS + 1))
    assert _rl_steps(run / "process_1" / "metrics.jsonl") == list(range(1, STEPS + 1))
