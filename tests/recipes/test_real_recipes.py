"""The shipped real-model recipes, run at tiny scale on random checkpoints of their families."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentax.cli import dump_config, load_config, main
from agentax.run._build import resolve_config
from agentax.recipes import RECIPES, load_tasks, recipe_path
from agentax.trace import TRACE_FILENAME, names, read_trace

REAL = {"gsm8k_qwen2_5_0_5b": "qwen2", "math_tool_qwen3_0_6b": "qwen3",
        "gsm8k_llama3_2_1b": "llama"}


def _shrink(ckpt, data):
    return [
        f"init.model_path={ckpt}", "init.dtype=float32", "trainer.compute_dtype=null",
        f"tasks.train_file={data}", "tasks.eval_file=null", "tasks.num_eval=2",
        "engine.max_slots=4", "engine.max_seq_len=1100", "engine.prefill_chunk=512",
        "engine.min_prefill_bucket=512", "eval.max_concurrency=4", "eval.every=0",
        "pipeline.max_concurrency=4", "pipeline.group_size=2", "pipeline.groups_per_step=1",
        "pipeline.filters=[]", "sampling.max_tokens=8", "collector.max_episode_tokens=1024",
        "trainer.micro_batch_size=2", "trainer.min_seq_bucket=1024", "run.steps=1",
        "run.checkpoint_every=0", "tracing.console=false",
    ]


ENV_OF_RECIPE = {  # recipe name prefix -> the environment factory it must name
    "calculator": "agentax.recipes.calculator:make_env", "gsm8k": "agentax.envs:TaskEnvironment",
    "math_tool": "agentax.recipes.math:make_tool_env", "math": "agentax.envs:TaskEnvironment",
    "frozen_lake": "agentax.recipes.frozen_lake:make_env", "bash": "agentax.recipes.bash:make_env",
    "swe_tiny": "agentax.recipes.swe_tiny:make_env", "swe_real": "agentax.recipes.swe_real:make_env",
    "mcp_tools": "agentax.recipes.mcp_tools:make_env",
    "openai_calculator": "agentax.recipes.openai_calculator:make_env",
    "agents_sdk_calculator": "agentax.recipes.agents_sdk_calculator:make_env",
    "web": "agentax.recipes.web:make_env", "mini_swe": "agentax.recipes.mini_swe:make_env",
    "selfplay": "agentax.recipes.selfplay:make_env",
    "solver_verifier": "agentax.recipes.solver_verifier:make_env",
}


def test_every_real_recipe_is_listed_and_loads(tmp_path):
    assert set(REAL) | {"calculator"} <= set(RECIPES)
    for name in RECIPES:
        cfg = load_config(recipe_path(name))
        # The name says the task; the YAML is a serialized RunConfig that round-trips exactly.
        prefix = max((p for p in ENV_OF_RECIPE if name.startswith(p)), key=len)
        assert cfg.env.factory == ENV_OF_RECIPE[prefix], name
        (tmp_path / f"{name}.yaml").write_text(dump_config(cfg))
        # (As a run directory keeps it: relative paths not moved onto the file's folder.)
        assert load_config(tmp_path / f"{name}.yaml", relative_to_file=False) == cfg, name
        if name in REAL:
            assert cfg.init.model_path, f"{name} must name the checkpoint it was written for"


def test_calculator_recipe_is_the_embedded_default():
    from agentax.cli import RunConfig

    assert load_config(recipe_path("calculator")) == RunConfig()


def test_gsm8k_jsonl_answers(math_jsonl):
    tasks = load_tasks(math_jsonl)
    assert [t.answer for t in tasks][:2] == ["7", "15"]


@pytest.mark.parametrize("recipe", sorted(REAL))
def test_recipe_resolves_the_checkpoint_architecture(recipe, tiny_checkpoints, math_jsonl):
    family = REAL[recipe]
    cfg = resolve_config(load_config(recipe_path(recipe), _shrink(tiny_checkpoints[family],
                                                                    math_jsonl)))
    assert cfg.model.family == family and cfg.model.hidden_size == 32
    with pytest.raises(Exception, match="decides the architecture"):
        resolve_config(load_config(recipe_path(recipe), [
            *_shrink(tiny_checkpoints[family], math_jsonl), "model.num_layers=7"]))


@pytest.mark.parametrize("recipe", sorted(REAL))
def test_recipe_evaluates_a_real_family_checkpoint(recipe, tiny_checkpoints, math_jsonl,
                                                   tmp_path, capsys):
    ckpt = tiny_checkpoints[REAL[recipe]]
    status = main(["eval", recipe, *_shrink(ckpt, math_jsonl), f"run.runs_dir={tmp_path}",
                   "eval.samples=0"])
    out = capsys.readouterr()
    assert status == 0, out.err
    result = json.loads(out.out.strip().splitlines()[-1])
    assert result["eval"]["eval/greedy/episodes"] == 2
    # A random model scores ~0, so check the episodes themselves: each generated tokens and
    # ended normally (not model_error / timeout: the template, tokenizer and engine all worked).
    trace = read_trace(Path(result["run_dir"]) / TRACE_FILENAME)
    episodes = trace.spans_named(names.EPISODE)
    assert len(episodes) == 2
    assert {s.args[names.ARG_STATUS] for s in episodes} <= {"ok", "truncated"}
    assert all(s.args["generated_tokens"] > 0 for s in trace.spans_named(names.MODEL_CALL))


def test_multi_turn_tool_recipe_trains_one_step(tiny_checkpoints, math_jsonl, tmp_path, capsys):
    ckpt = tiny_checkpoints["qwen3"]
    status = main(["train", "math_tool_qwen3_0_6b", *_shrink(ckpt, math_jsonl),
                   f"run.runs_dir={tmp_path}", "run.name=tool", "eval.samples=0",
                   "eval.greedy=false"])
    out = capsys.readouterr()
    assert status == 0, out.err
    summary = json.loads((tmp_path / "tool" / "summary.json").read_text())
    assert summary["rl_steps"] == 1 and summary["trajectories_trained"] == 2
