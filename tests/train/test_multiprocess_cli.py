"""`agentax train` as 2 local processes x 2 CPU devices, one trainer mesh (fsdp=4) over both:
the demo (shrunk: 2 SFT steps, 2 RL steps) runs SFT, RL and both evaluations to the end, as
docs/scaling.md's "Several processes on one machine" command does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compile_flags import fast_compile_xla_flags

pytestmark = pytest.mark.slow  # two fresh processes through the whole demo: ~3-4 min on 2 cores

# tests/cli/test_commands.py's miniature of the demo: every stage runs, nothing has to learn.
TINY = [
    "sft.steps=2", "sft.batch_size=8", "sft.batch_tokens=0", "sft.num_demos=32", "run.steps=2",
    "tasks.num_train=64", "tasks.num_eval=4",
    "pipeline.group_size=2", "pipeline.groups_per_step=2", "pipeline.max_concurrency=8",
    "pipeline.filters=[]",
    "engine.max_slots=8", "eval.max_concurrency=8", "eval.samples=1",
    "tracing.console=false", "tracing.transcripts_fraction=1.0",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_agentax_train_as_two_local_processes(tmp_path):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=fast_compile_xla_flags("--xla_force_host_platform_device_count=2"))
    script = Path(sys.executable).with_name("agentax")  # the installed `agentax` command
    command = ([str(script)] if script.exists() else
               [sys.executable, "-c", "import sys; from agentax.cli import main; "
                "sys.exit(main(sys.argv[1:]))"])
    base = [*command, "train", *TINY, f"run.runs_dir={tmp_path}",
            "run.name=two-processes", "trainer.mesh={fsdp: 4}",
            "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2"]
    procs = [subprocess.Popen([*base, "--process-id", str(i)], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=900))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        lines = [ln for ln in err.splitlines()
                 if "[Gloo]" not in ln and "spmd_partitioner" not in ln]
        assert p.returncode == 0, f"process {i} failed:\n" + "\n".join(lines[-40:])
    # Process 0 speaks and prints the summary, the only line on its stdout (gloo's connection
    # lines go to stderr); process 1 is silent.
    assert len(outs[0][0].splitlines()) == 1 and json.loads(outs[0][0])["run_dir"]
    assert "agentax train ->" in outs[0][1]
    assert outs[1][0] == "" and "agentax train ->" not in outs[1][1]

    run = tmp_path / "two-processes"
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("phase") == "rl"] == [1, 2]
    assert {r["phase"] for r in rows} >= {"sft", "eval_before", "rl", "eval_after"}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rl_steps"] == 2
    # One checkpoint directory written by both processes; each RL step trained on both
    # processes' groups: 2 steps x 2 processes x groups_per_step=2.
    meta = json.loads((run / "checkpoints" / "step_2" / "meta.json").read_text())
    assert meta["step_count"] == 2 and meta["data_position"] == 8
    assert (run / "checkpoints" / "step_2" / "state").is_dir()
    assert not list((run / "checkpoints").glob(".tmp-*"))
    # Process 1's own metrics (its episodes), trace and transcripts; the trace is one file each.
    own = [json.loads(ln) for ln in (run / "process_1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in own if r.get("phase") == "rl"] == [1, 2]
    assert list(run.glob("*.perfetto-trace")) and list((run / "process_1").glob("*.perfetto-trace"))
    assert not (run / "process_0").exists()
    # Data-parallel rollouts: the processes trained on disjoint groups (ids, tasks) with
    # different samples, not two copies of the same episodes.
    trained = [[json.loads(ln) for ln in (d / "transcripts.jsonl").read_text().splitlines()
                if json.loads(ln)["phase"] == "train"] for d in (run, run / "process_1")]
    groups = [{r["group_id"] for r in rows} for rows in trained]
    assert all(groups) and not groups[0] & groups[1], groups
    assert {r["task_id"] for r in trained[0]} != {r["task_id"] for r in trained[1]}
    texts = [{t["raw"] for r in rows for t in r["turns"]} for rows in trained]
    assert texts[0] != texts[1]
