"""Real `agentax` processes for fault injection: start, kill at a chosen point, inspect.

Used by tests/faults and benchmarks/faults.py. A run is a miniature of the demo (no SFT, no
evaluation episodes) so that its cost is the compile of the engine and train kernels.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import agentax

SRC = Path(agentax.__file__).resolve().parents[1]

TINY = (
    "sft.steps=0", "env.num_train_tasks=64", "env.num_eval_tasks=2",
    "pipeline.group_size=2", "pipeline.groups_per_step=2", "pipeline.max_concurrency=4",
    "pipeline.filters=[]", "engine.max_slots=4", "eval.max_concurrency=4",
    "eval.greedy=false", "eval.samples=0", "tracing.console=false", "tracing.plots=false",
    "tracing.doctor=false",
)
"""Overrides of a miniature run: every RL stage runs, nothing is expected to learn."""

# Runs `agentax` in a child process; AGENTAX_TEST_KILL_AT="<point>:<step>" makes the child
# SIGKILL itself at that point of the checkpoint save of RL step <step>:
#   orbax   - the array files are being written (Orbax's save returned, not finalised)
#   rename  - the checkpoint is complete under its temporary name, not yet renamed
_LAUNCHER = r"""
import os, signal, sys
point, _, step = os.environ.get("AGENTAX_TEST_KILL_AT", "").partition(":")
if point:
    from agentax.train import _checkpoint as ck
    def _die():
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "rename":
        orig = ck._fsync_tree
        def _fsync_tree(path):
            orig(path)
            if path.name.startswith(f".tmp-step_{step}-"):
                _die()
        ck._fsync_tree = _fsync_tree
    elif point == "orbax":
        import orbax.checkpoint as ocp
        orig_save = ocp.StandardCheckpointer.save
        def save(self, directory, *args, **kwargs):
            orig_save(self, directory, *args, **kwargs)
            if directory.parent.name.startswith(f".tmp-step_{step}-"):
                _die()
        ocp.StandardCheckpointer.save = save
from agentax.cli import main
sys.exit(main(sys.argv[1:]))
"""


def env(kill_at: str = "") -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(SRC), out.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out["JAX_PLATFORMS"] = "cpu"
    out.pop("AGENTAX_TEST_KILL_AT", None)
    if kill_at:
        out["AGENTAX_TEST_KILL_AT"] = kill_at
    return out


def start(args, *, kill_at: str = "", cwd=None) -> subprocess.Popen:
    """Starts `agentax ARGS` (output captured as text)."""
    return subprocess.Popen([sys.executable, "-c", _LAUNCHER, *args], env=env(kill_at),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)


def run(args, *, kill_at: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `agentax ARGS` to its end."""
    proc = start(args, kill_at=kill_at)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def rl_steps(run_dir: Path) -> list[int]:
    """Steps of the complete RL rows of metrics.jsonl, in file order."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("phase") == "rl":
            steps.append(row["step"])
    return steps


def wait_for_rl_step(proc: subprocess.Popen, run_dir: Path, step: int,
                     timeout: float = 300) -> bool:
    """Waits until metrics.jsonl has RL step `step` (False if the process ended first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step in rl_steps(run_dir):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    raise TimeoutError(f"no RL step {step} in {run_dir} after {timeout} s")


def send(proc: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 300):
    """Sends `sig` to the child and waits for it; returns (returncode, stdout, stderr)."""
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def checkpoint_dirs(run_dir: Path) -> list[str]:
    d = Path(run_dir) / "checkpoints"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def error_lines(stderr: str) -> list[str]:
    """The non-empty stderr lines that are not log/warning chatter of libraries."""
    return [line for line in stderr.splitlines() if line.strip()
            and not line.startswith(("WARNING", "INFO", "W0", "I0", "E0"))]
