"""examples/slurm_job.sh: a requeued job (the same SLURM_JOB_ID again) resumes its own run
directory instead of failing on "already exists". Run without Slurm (SRUN empty: one task)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_commands import TINY

SCRIPT = Path(__file__).parents[2] / "examples" / "slurm_job.sh"


@pytest.mark.slow  # two short `agentax train` runs: ~40-60 s on 2 cores
def test_a_requeued_job_resumes_its_run(tmp_path):
    agentax = shutil.which("agentax", path=os.path.dirname(sys.executable))
    assert agentax, "the agentax command is installed next to the test's python"
    env = dict(os.environ, RUNS_DIR=str(tmp_path), SRUN="", SLURM_JOB_ID="4242",
               PATH=os.path.dirname(agentax) + os.pathsep + os.environ["PATH"])
    first = subprocess.run(["bash", str(SCRIPT), "calculator", *TINY], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    run = tmp_path / "job-4242"
    config = (run / "config.yaml").read_text()
    again = subprocess.run(["bash", str(SCRIPT), "calculator", *TINY], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already exists" not in again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job-4242"]
    assert (run / "config.yaml").read_text() == config
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("phase") == "rl"] == [1]  # resumed, not re-run
