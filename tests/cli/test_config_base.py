"""`base:` in a YAML run config (extend a recipe or another file) and relative paths that
resolve against the config file's directory."""

from __future__ import annotations

import os

import pytest

from agentax.cli import dump_config, load_config, main
from agentax.config import ConfigError
from agentax.recipes import recipe_path


def _write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_base_by_recipe_name_then_file_then_overrides(tmp_path, capsys):
    mine = _write(tmp_path / "mine.yaml", "base: frozen_lake\nrun: {steps: 5}\n"
                                          "tasks: {num_train: 100}\n")
    recipe = load_config(recipe_path("frozen_lake"))
    cfg = load_config(mine, ["tasks.num_train=50"])
    assert cfg.env == recipe.env and cfg.agent == recipe.agent and cfg.sft == recipe.sft
    assert cfg.run.steps == 5 and cfg.tasks.num_train == 50  # the file, then the override
    assert cfg.tasks.factory == recipe.tasks.factory and cfg.tasks.num_eval == recipe.tasks.num_eval
    # `agentax config FILE` prints the merged result (no `base:` key left in it).
    assert main(["config", str(mine)]) == 0
    out = capsys.readouterr().out
    assert out == dump_config(load_config(mine))
    assert not any(line.startswith("base") for line in out.splitlines())
    assert "agentax.recipes.frozen_lake:make_env" in out


def test_base_by_relative_path_and_chain(tmp_path, monkeypatch):
    _write(tmp_path / "common" / "root.yaml", "base: frozen_lake\nrun: {steps: 7, seed: 3}\n"
                                              "env: {kwargs: {max_steps: 6}}\n")
    _write(tmp_path / "common" / "middle.yaml", "base: root.yaml\nrun: {steps: 9}\n")
    leaf = _write(tmp_path / "exp" / "leaf.yaml", "base: ../common/middle.yaml\n"
                                                  "tasks: {num_eval: 8}\n")
    monkeypatch.chdir(tmp_path / "common")  # a relative base is relative to its file, not here
    cfg = load_config(leaf)
    assert cfg.env.factory == "agentax.recipes.frozen_lake:make_env"
    assert dict(cfg.env.kwargs) == {"max_steps": 6}
    assert cfg.run.steps == 9 and cfg.tasks.num_eval == 8
    assert cfg.run.seed == 3 and cfg.pipeline.seed == 3  # a base's run.seed still derives
    assert cfg.sft.num_demos == load_config(recipe_path("frozen_lake")).sft.num_demos


def test_a_cycle_of_bases_is_one_line_naming_the_file_and_base(tmp_path):
    _write(tmp_path / "a.yaml", "base: b.yaml\n")
    _write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle") as err:
        load_config(tmp_path / "a.yaml")
    assert "b.yaml" in str(err.value) and "'a.yaml'" in str(err.value)
    assert "\n" not in str(err.value)
    _write(tmp_path / "self.yaml", "base: ./self.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "self.yaml")


@pytest.mark.parametrize("base, message", [
    ("missing.yaml", "base 'missing.yaml' does not exist"),
    ("no_such_recipe", "neither a shipped recipe"),
    ("[1, 2]", "base must be a recipe name"),
])
def test_a_missing_base_is_one_line_naming_the_file_and_base(tmp_path, base, message, capsys):
    path = _write(tmp_path / "mine.yaml", f"base: {base}\n")
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert main(["config", str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_relative_paths_resolve_against_the_config_file(tmp_path, monkeypatch):
    demos = _write(tmp_path / "cfg" / "data" / "demos.jsonl", '{"messages": []}\n')
    _write(tmp_path / "cfg" / "tasks" / "train.jsonl", '{"prompt": "1+1", "answer": "2"}\n')
    _write(tmp_path / "base" / "base.yaml", "base: calculator\nsft: {data: base_demos.jsonl}\n"
                                            "init: {tokenizer: byte}\n")
    path = _write(tmp_path / "cfg" / "run.yaml", "\n".join([
        "base: ../base/base.yaml",
        "run: {runs_dir: my_runs}",
        "sft: {data: data/demos.jsonl}",
        "tasks: {factory: null, train_file: tasks/train.jsonl, eval_file: /abs/eval.jsonl}",
        "env: {factory: 'agentax.recipes.calculator:make_env'}",
        "init: {from_run: ../runs/earlier}",
    ]) + "\n")
    monkeypatch.chdir(tmp_path / "base")  # not the file's directory
    cfg = load_config(path)
    assert cfg.sft.data == str(demos) and os.path.isfile(cfg.sft.data)
    assert cfg.tasks.train_file == str(tmp_path / "cfg" / "tasks" / "train.jsonl")
    assert cfg.tasks.eval_file == "/abs/eval.jsonl"  # absolute: untouched
    assert cfg.init.from_run == str(tmp_path / "runs" / "earlier")
    assert cfg.init.tokenizer == "byte"  # not a path
    assert cfg.env.factory == "agentax.recipes.calculator:make_env"  # an import path: untouched
    assert cfg.run.runs_dir == "my_runs"  # where runs go follows the current directory
    # A base's own relative path resolves against the base's directory.
    assert load_config(tmp_path / "base" / "base.yaml").sft.data == str(
        tmp_path / "base" / "base_demos.jsonl")
    # Command-line overrides keep resolving against the current directory.
    assert load_config(path, ["sft.data=here.jsonl"]).sft.data == "here.jsonl"


def test_a_run_directory_config_keeps_its_paths(tmp_path, monkeypatch):
    from agentax.run._rundir import run_config, write_config

    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["sft.data=data/demos.jsonl", f"run.runs_dir={tmp_path}"])
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    write_config(run_dir, cfg)
    assert run_config(run_dir).sft.data == "data/demos.jsonl"
    (run_dir / "metrics.jsonl").write_text("")
    assert load_config(run_dir / "config.yaml").sft.data == "data/demos.jsonl"
    # Shipped recipes' paths (where you put checkpoints and data) stay relative to here too.
    assert load_config(recipe_path("gsm8k_qwen2_5_0_5b")).init.model_path.startswith("models/")
