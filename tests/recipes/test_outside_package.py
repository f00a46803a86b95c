"""A package outside agentax (tests/fixtures/byo_pkg) trained by `agentax train its.yaml`.

It brings its own Environment, Agent, task file, demonstrations and advantage estimator; the
run goes through the real console script in a subprocess, with no agentax edit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import agentax

PKG = Path(__file__).parents[1] / "fixtures" / "byo_pkg"


def _agentax_command() -> list[str]:
    script = Path(sys.executable).parent / "agentax"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from agentax.cli import main; sys.exit(main())"]


def test_the_fixture_package_is_not_part_of_agentax():
    import importlib.util

    assert importlib.util.find_spec("wordgame") is None or "fixtures" in str(
        importlib.util.find_spec("wordgame").origin)
    assert not (Path(agentax.__file__).parent / "wordgame").exists()


def test_agentax_train_runs_a_package_from_outside_the_tree(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PKG), str(Path(agentax.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [*_agentax_command(), "train", "its.yaml", f"run.runs_dir={tmp_path}", "run.name=byo"],
        cwd=PKG, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "byo"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and summary["trajectories_trained"] == 16
    assert summary["task"] == "wordgame:make_env"
    # The environment's own per-episode metrics reach metrics.jsonl and the evaluations.
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in records if r.get("phase") == "rl"]
    assert len(rl) == 2 and all("first_try" in r and 1.0 <= r["tries"] <= 2.0 for r in rl)
    assert "eval/greedy/first_try" in summary["eval_after"]
    assert "eval/greedy/first_try" in summary["eval_before"]
    # The user's estimator was the one trained with.
    import yaml

    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["trainer"]["advantage"] == "wordgame_sign"
    assert resolved["run"]["imports"] == ["wordgame"]


def test_a_factory_of_the_wrong_type_fails_before_compiling(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PKG), str(Path(agentax.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [*_agentax_command(), "train", "its.yaml", f"run.runs_dir={tmp_path}",
         "agent.factory=wordgame:make_env"],
        cwd=PKG, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "agent.factory=wordgame:make_env returned WordEnvironment" in last
