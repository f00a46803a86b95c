"""SFT is a resumable phase of `agentax train`: kill -9 or a signal during the warm start, then
`agentax train RUN_DIR` continues SFT from its newest checkpoint (issue 47 item 3)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.faults.fault_helpers import TINY, error_lines, rl_steps, run, send, start

SFT = [a for a in TINY if not a.startswith("sft.")] + [
    "sft.steps=40", "sft.checkpoint_every_s=0.3", "run.steps=1"]


def _rows(run_dir: Path, phase: str) -> list[int]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return [r["step"] for r in rows if r.get("phase") == phase]


def _sft_steps(run_dir: Path) -> list[int]:
    d = run_dir / "checkpoints" / "sft"
    return sorted(int(p.name[5:]) for p in d.glob("step_*")) if d.is_dir() else []


def _wait_for_sft_checkpoint(proc, run_dir: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not _sft_steps(run_dir) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert _sft_steps(run_dir), "no SFT checkpoint appeared"


def test_kill_during_sft_then_resume_continues_sft(tmp_path):
    run_dir = tmp_path / "k"
    proc = start(["train", *SFT, f"run.runs_dir={tmp_path}", "run.name=k"])
    _wait_for_sft_checkpoint(proc, run_dir)
    send(proc, signal.SIGKILL)
    saved = _sft_steps(run_dir)
    assert len(saved) == 1 and 0 < saved[0] < 40  # the newest only
    resumed = run(["train", str(run_dir), "-q"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed SFT from step {saved[0]}" in resumed.stderr
    sft_rows = _rows(run_dir, "sft")
    assert sft_rows == sorted(set(sft_rows)) and sft_rows[-1] == 40  # each logged step once
    assert _sft_steps(run_dir) == [40] and rl_steps(run_dir) == [1]
    assert _rows(run_dir, "eval_before") == [0]


@pytest.mark.slow
def test_sigint_during_sft_saves_and_the_resume_continues(tmp_path):
    run_dir = tmp_path / "s"
    proc = start(["train", *SFT, f"run.runs_dir={tmp_path}", "run.name=s"])
    _wait_for_sft_checkpoint(proc, run_dir)
    code, _, err = send(proc, signal.SIGINT, timeout=60)
    assert code == 130, err
    line = [x for x in error_lines(err) if x.startswith("agentax train:")]
    assert len(line) == 1 and "stopped at SFT step" in line[0] and "Traceback" not in err, err
    assert "(interrupted by SIGINT)" in line[0], line[0]
    step = int(line[0].split("stopped at SFT step ")[1].split()[0])
    assert _sft_steps(run_dir) == [step]
    resumed = run(["train", str(run_dir), "-q"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed SFT from step {step}" in resumed.stderr and rl_steps(run_dir) == [1]
