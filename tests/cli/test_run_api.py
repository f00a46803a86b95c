"""`agentax.run`: the library entry point that `agentax train | sft | eval` call.

One tiny run through `train` with a user hook, then `evaluate` of its policy and the forms of
config `as_config` takes (~10 s on 2 cores, most of it compiling)."""

from __future__ import annotations

import json

import pytest

from agentax.config import ConfigError
from agentax.run import Hook, RunConfig, RunResult, StepInfo, as_config, evaluate, train
from tests.cli.test_commands import TINY


def test_train_runs_user_hooks_and_returns_the_run(tmp_path):
    seen: list[tuple[int, int, dict]] = []

    def hook(info: StepInfo) -> None:
        seen.append((info.step, info.total_steps, dict(info.metrics)))

    cfg = as_config(None, [*TINY, "run.steps=4", f"run.runs_dir={tmp_path}", "run.name=lib"])
    result = train(cfg, hooks=[Hook(hook, every=2)], quiet=True)
    assert isinstance(result, RunResult) and result.run_dir == tmp_path / "lib"
    # every=2 over steps 1..4; the metrics are the step's metrics.jsonl row, logged first
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [(s, t) for s, t, _ in seen] == [(2, 4), (4, 4)]
    assert [m["step"] for _, _, m in seen] == [2, 4]
    assert [sorted(m) for _, _, m in seen] == [sorted(rl[1]), sorted(rl[3])]
    assert [m["loss"] for _, _, m in seen] == [rl[1]["loss"], rl[3]["loss"]]
    assert result.steps == 4 and result.metrics["step"] == 4 == rl[-1]["step"]
    assert set(result.eval_before) == set(result.eval_after) and result.eval_after
    assert result.sft is not None and "sft/loss" in result.sft
    assert json.loads((result.run_dir / "summary.json").read_text())["rl_steps"] == 4

    # The trained run's policy, evaluated into a fresh run directory beside it.
    again = evaluate(result.run_dir, overrides=["tasks.num_eval=2"], quiet=True)
    assert again.run_dir != result.run_dir and again.run_dir.parent == tmp_path
    assert again.steps == 0 and again.eval_after and again.eval_before is None


def test_a_hook_that_fails_fails_the_run(tmp_path):
    def boom(info: StepInfo) -> None:
        raise RuntimeError(f"hook failed at step {info.step}")

    with pytest.raises(RuntimeError, match="hook failed at step 1"):
        train(RunConfig(), tmp_path / "boom", quiet=True,
              overrides=[*TINY, "sft.steps=0", "run.steps=2", "tracing.doctor=false"],
              hooks=[Hook(boom)])
    rows = (tmp_path / "boom" / "metrics.jsonl").read_text().splitlines()
    # the run's own hooks (metrics.jsonl's row of step 1) ran before the user's
    assert [json.loads(r)["phase"] for r in rows] == ["eval_before", "rl"]


def test_a_given_run_dir_is_kept_after_a_failed_start(tmp_path):
    with pytest.raises(ConfigError, match="failed when called with env.kwargs"):
        train({"env": {"kwargs": {"bogus": 1}}}, tmp_path / "mine", quiet=True)
    assert (tmp_path / "mine" / "config.yaml").exists()


def test_as_config_takes_a_config_a_mapping_a_recipe_a_file_or_a_run_dir(tmp_path):
    cfg = as_config({"run": {"steps": 3}, "pipeline": {"group_size": 4}})
    assert (cfg.run.steps, cfg.pipeline.group_size) == (3, 4)
    assert as_config(cfg, ["run.steps=5"]).run.steps == 5
    assert as_config("frozen_lake").env.factory != RunConfig().env.factory
    (tmp_path / "c.yaml").write_text("run:\n  steps: 7\n")
    assert as_config(tmp_path / "c.yaml").run.steps == 7
    with pytest.raises(ConfigError, match="Did you mean 'steps'"):
        as_config({"run": {"stepz": 3}})
    with pytest.raises(ConfigError, match="neither a YAML file, a recipe nor a run directory"):
        as_config("no-such-recipe")
    # Bad input found once the run started (its fresh run directory made): the directory goes.
    with pytest.raises(ConfigError, match="failed when called with env.kwargs"):
        train({"run": {"name": "x", "runs_dir": str(tmp_path / "runs")},
               "env": {"kwargs": {"bogus": 1}}}, quiet=True)
    assert (tmp_path / "runs").is_dir() and not (tmp_path / "runs" / "x").exists()


def test_a_converged_run_stops_early_evaluates_and_says_why(tmp_path, capsys):
    """Every episode succeeds (a registered reward adds 1), so the latest 4 training episodes
    succeed at 100% before the first step: RL ends at step 0 of 3, the evaluation after RL
    still runs, and the run says why (console, summary.json, `RunResult.stopped_early`)."""
    from agentax.rewards import register_reward

    register_reward("always_right_for_stop_test", lambda task, response: 1.0, overwrite=True)
    result = train(None, tmp_path / "stop", overrides=[
        *TINY, "run.steps=3", "sft.steps=0", "env.reward=always_right_for_stop_test",
        "pipeline.stop_success=0.5", "pipeline.stop_window=4", "tracing.doctor=false"])
    stopped = result.stopped_early
    assert stopped is not None and stopped["step"] == result.steps < 3
    assert "the last 4 training episodes succeeded at 100.0% >= pipeline.stop_success=0.5" in \
        stopped["reason"]
    assert json.loads((result.run_dir / "summary.json").read_text())["stopped_early"] == stopped
    assert result.eval_after and result.eval_after["eval/greedy/success"] == 1.0
    assert f"rl: stopped after step {result.steps} of 3: the last 4" in capsys.readouterr().err
