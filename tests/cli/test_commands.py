"""The `agentax` commands end to end on a miniature run: train, resume, eval, export, doctor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from agentax.cli import main
from agentax.trace import read_metrics

# A miniature of the demo: every stage runs, nothing is expected to learn.
TINY = [
    "sft.steps=2", "sft.batch_size=8", "sft.batch_tokens=0", "sft.num_demos=32", "run.steps=1",
    "tasks.num_train=64", "tasks.num_eval=4",
    "pipeline.group_size=2", "pipeline.groups_per_step=2", "pipeline.max_concurrency=8",
    "pipeline.filters=[]",  # an untrained policy gets 0 everywhere: keep its groups
    "engine.max_slots=8", "eval.max_concurrency=8", "eval.samples=1",
    "tracing.console=false",
]


def _run(args, capsys):
    status = main(args)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_train_resume_eval_export_doctor(tmp_path, capsys):
    runs = tmp_path / "runs"
    status, out, err = _run(["train", *TINY, f"run.runs_dir={runs}", "run.name=mini"], capsys)
    assert status == 0, err
    run = runs / "mini"
    for name in ("config.yaml", "metrics.jsonl", "trace.perfetto-trace", "curves.png",
                 "summary.json"):
        assert (run / name).is_file(), name
    assert (run / "checkpoints" / "step_1" / "meta.json").is_file()
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["pipeline"]["group_size"] == 2 and cfg["run"]["steps"] == 1
    records = read_metrics(run)
    phases = [r.get("phase") for r in records]
    assert phases.count("rl") == 1 and "eval_before" in phases and "eval_after" in phases
    rl = next(r for r in records if r.get("phase") == "rl")
    for key in ("success", "tool_use", "reward", "turns", "staleness", "traj_per_s", "loss"):
        assert key in rl
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rl_steps"] == 1 and "doctor" in summary
    assert "eval_before" in json.loads(out.strip().splitlines()[-1])

    meta = json.loads((run / "checkpoints" / "step_1" / "meta.json").read_text())
    assert meta["run"]["rl_step"] == 1 and meta["run"]["metrics_bytes"] > 0

    # Resume (an option among the overrides): the run continues to the new total.
    status, out, err = _run(["train", str(run), "-q", "run.steps=2"], capsys)
    assert status == 0, err
    # -q: nothing on the console but the resume line (a resume never passes unseen)
    assert err.splitlines() == [line for line in err.splitlines()
                                if line.startswith("resumed from step 1 (")] and len(
        err.splitlines()) == 1, err
    summary = json.loads((run / "summary.json").read_text())  # the whole run, both segments
    assert summary["rl_steps"] == 2 and summary["segment"]["rl_steps"] == 1
    assert summary["segment"]["resumed_from_step"] == 1 and "eval_before" in summary
    assert yaml.safe_load((run / "config.yaml").read_text())["run"]["steps"] == 2
    steps = [r["step"] for r in read_metrics(run) if r.get("phase") == "rl"]
    assert steps == [1, 2]
    assert (run / "checkpoints" / "step_2" / "meta.json").is_file()

    # eval from the run directory writes its own run directory.
    status, out, err = _run(["eval", str(run), f"run.runs_dir={runs}"], capsys)
    assert status == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    # Same final checkpoint, same held-out tasks, greedy and seeded sampling: `eval RUN`
    # reproduces the numbers the resumed run reported after its last step, over all 4 tasks.
    final_eval = [r for r in read_metrics(run) if r.get("phase") == "eval_after"][-1]
    assert result["eval"] == {k: final_eval[k] for k in result["eval"]}
    assert result["eval"]["eval/greedy/episodes"] == result["eval"]["eval/sampled/episodes"] == 4
    assert Path(result["run_dir"]) != run

    # export -> Hugging Face safetensors that load back to the same weights.
    out_dir = tmp_path / "hf"
    status, out, err = _run(["export", str(run), str(out_dir)], capsys)
    assert status == 0, err
    from agentax.run._build import load_run_model
    from agentax.run._rundir import run_config
    from agentax.models import load_pretrained

    loaded = load_pretrained(out_dir)
    ours = load_run_model(run, run_config(run))
    ids = np.arange(1, 20, dtype=np.int32)[None]
    np.testing.assert_allclose(np.asarray(loaded(ids)), np.asarray(ours(ids)), atol=1e-5)

    status, out, err = _run(["doctor", str(run)], capsys)
    assert status == 0 and "Bottleneck:" in out and "Verdict:" in out
    # The wall time says what it covers: the first segment's SFT warm start apart from RL.
    assert "= SFT warm start " in out and "(2 steps) + RL part" in out, out


@pytest.mark.parametrize("args,needle", [
    (["train", "trainer.learnin_rate=1"], "Did you mean 'learning_rate'"),
    (["train", "pipeline.group_size=1"], "pipeline.group_size>=2"),
    (["train", "no-such-recipe"], "neither a YAML file nor a recipe"),
    (["export", "/nonexistent/run", "/nonexistent/out"], "config.yaml"),
    (["train", "pipeline.mode=asynch"], "choose one of 'sync', 'async'"),
])
def test_user_errors_exit_2_with_the_fix(args, needle, capsys):
    status, out, err = _run(args, capsys)
    assert status == 2 and needle in err


def test_config_command_prints_reference_and_recipes(capsys):
    status, out, _ = _run(["config", "--recipes"], capsys)
    assert status == 0 and "calculator" in out.split()
    status, out, _ = _run(["config", "calculator", "run.steps=3"], capsys)
    assert status == 0 and yaml.safe_load(out)["run"]["steps"] == 3
    status, out, _ = _run(["config", "--reference"], capsys)
    assert out.startswith("# Configuration reference")


def test_sft_and_config_accept_a_run_directory(tmp_path, capsys):
    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"run:\n  name: old\n  runs_dir: {tmp_path / 'runs'}\n")
    status, out, _ = _run(["config", str(run), "run.steps=3"], capsys)
    assert status == 0 and yaml.safe_load(out)["run"]["steps"] == 3
    # `sft RUN_DIR` reads that run's config.yaml (a new run directory, so sft.steps=0 is the
    # first complaint, not "no config.yaml").
    status, _, err = _run(["sft", str(run), "sft.steps=0", "tracing.console=false"], capsys)
    assert status == 2 and "sft.steps is 0" in err


def test_a_failed_resume_leaves_config_yaml_alone(tmp_path, capsys):
    from tests.faults.fault_helpers import make_run_dir

    run = make_run_dir(tmp_path / "r")
    before = (run / "config.yaml").read_text()
    # A different model cannot restore the checkpoint: the resume fails, config.yaml stays.
    status, _, err = _run(["train", str(run), "-q", "model.num_layers=1"], capsys)
    assert status == 2 and "does not fit" in err
    assert (run / "config.yaml").read_text() == before
