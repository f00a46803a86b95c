"""Crash safety of a run directory, with real `agentax train` processes killed for real.

* kill -9 while the last checkpoint is being saved (Orbax writing its arrays, or complete
  under its temporary name): the resume continues from the newest complete checkpoint,
  says which, and metrics.jsonl ends with each RL step exactly once.
* Ctrl-C (a real SIGINT) during RL: exit 130, one line, a checkpoint of the last finished
  step; a resume continues from it; a kill -9 at an arbitrary moment of that resume, and a
  second resume, still leave each step once and a trace the doctor reads.
"""

from __future__ import annotations

import signal

import pytest

import agentax.trace

from tests.faults.fault_helpers import (
    TINY,
    checkpoint_dirs,
    error_lines,
    rl_steps,
    run,
    send,
    start,
    wait_for_rl_step,
)


@pytest.mark.slow  # 16-18 s of real runs and kills: CI's slow stage
def test_kill9_during_last_checkpoint_save_then_resume(tmp_path):
    run_dir = tmp_path / "r"
    args = ["train", *TINY, f"run.runs_dir={tmp_path}", "run.name=r", "run.steps=2",
            "run.checkpoint_every=1"]
    # Killed while Orbax writes step 2's arrays, then (resumed) once step 2 is complete
    # under its temporary name but not yet renamed into place.
    for point, args in (("orbax", args), ("rename", ["train", str(run_dir)])):
        killed = run(args, kill_at=f"{point}:2")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        names = checkpoint_dirs(run_dir)
        assert [n for n in names if not n.startswith(".tmp-step_2-")] == ["step_1"], names
        assert rl_steps(run_dir) == [1, 2]

    resumed = run(["train", str(run_dir)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 1" in resumed.stderr  # the newest complete one, named
    assert rl_steps(run_dir) == [1, 2]  # step 2 was cut and trained again: once
    assert checkpoint_dirs(run_dir) == ["step_1", "step_2"]  # the temporary one is gone


@pytest.mark.slow  # 16-18 s of real runs and kills: CI's slow stage
def test_ctrl_c_checkpoints_then_kill9_resume_loses_nothing(tmp_path):
    run_dir = tmp_path / "c"
    args = ["train", *TINY, f"run.runs_dir={tmp_path}", "run.name=c", "run.steps=40"]
    proc = start(args)
    assert wait_for_rl_step(proc, run_dir, 1), proc.communicate()[1][-3000:]
    code, _, err = send(proc, signal.SIGINT)
    assert code == 130, err[-3000:]
    assert "Traceback" not in err
    last = error_lines(err)[-1]
    assert last.startswith("agentax train: stopped at RL step") and "checkpoint" in last
    stopped = rl_steps(run_dir)
    k = stopped[-1]
    first_trace = (run_dir / "trace.perfetto-trace").stat().st_size
    assert first_trace > 0
    assert stopped == list(range(1, k + 1))
    assert f"step_{k}" in checkpoint_dirs(run_dir)

    # Resume, and kill -9 it at an arbitrary moment after it trained one more step.
    proc = start(["train", str(run_dir), f"run.steps={k + 3}", "run.checkpoint_every=2"])
    assert wait_for_rl_step(proc, run_dir, k + 1), proc.communicate()[1][-3000:]
    code, _, err = send(proc, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert f"resumed from step {k}" in err

    final = run(["train", str(run_dir)])
    assert final.returncode == 0, final.stderr[-3000:]
    assert rl_steps(run_dir) == list(range(1, k + 4))  # every step once, in order

    doctor = run(["doctor", str(run_dir)])
    assert doctor.returncode == 0, doctor.stderr[-3000:]
    assert "bottleneck" in doctor.stdout.lower()
    if hasattr(agentax.trace, "trace_segments"):  # the tracer writes one segment per resume
        # The first segment is as the interrupted process left it: no resume truncated it.
        assert (run_dir / "trace.perfetto-trace").stat().st_size == first_trace
        assert len(agentax.trace.trace_segments(run_dir)) == 3
