"""The mcp_tools recipe: its tasks, its sloppy demonstrator, its real MCP server (a stdio
subprocess) answering what the demonstrations say it answers, a miniature `agentax train
mcp_tools`, and (slow) the full recipe learning."""

from __future__ import annotations

import asyncio
import collections
import json
import re

import numpy as np
import pytest

pytest.importorskip("mcp")

from agentax.cli import load_config, main  # noqa: E402
from agentax.run._build import build_suite_for  # noqa: E402
from agentax.recipes import recipe_path  # noqa: E402
from agentax.recipes import mcp_tools as recipe  # noqa: E402
from agentax.recipes._mcp_server import secret_code  # noqa: E402
from agentax.recipes._render import render_examples  # noqa: E402
from agentax.records import Action, ToolCall  # noqa: E402
from agentax.text import ByteTokenizer  # noqa: E402
from agentax.trace import TRACE_FILENAME, names, read_trace  # noqa: E402


def _suite(*overrides):
    return build_suite_for(load_config(recipe_path("mcp_tools"),
                                       ["tasks.num_train=400", "tasks.num_eval=40", *overrides]))


def test_tasks_are_distinct_held_out_and_answered_by_the_secret_code():
    train, held = recipe.tasks(num_train=3000, num_eval=64, seed=0)
    again, _ = recipe.tasks(num_train=3000, num_eval=64, seed=0)
    assert [t.prompt for t in train] == [t.prompt for t in again]
    keys = [t.meta["key"] for t in train + held]
    assert len(set(keys)) == len(keys) and not {t.prompt for t in train} & {t.prompt for t in held}
    for t in train[:200]:
        assert re.fullmatch(r"Code of [a-z]{2}\d{2}\?", t.prompt)
        assert t.answer == secret_code(t.meta["key"]) and re.fullmatch(r"\d{4}", t.answer)
    assert len({t.answer for t in train}) > 2000  # codes look random: nothing to memorise
    with pytest.raises(ValueError, match="two letters and two digits"):
        secret_code("abc1")


def test_demonstrator_is_sloppy_in_the_documented_way_and_fits_the_limits():
    train, _ = recipe.tasks(num_train=3000, num_eval=0, seed=0)
    convs = recipe.demos(train, 3000, seed=1)
    used = collections.defaultdict(list)
    for task, conv in zip(train, convs):
        tool = len(conv) == 4
        used[task.meta["key"][0] <= "m"].append(tool)
        if tool:
            (call,) = conv[1].tool_calls
            assert (call.name, call.arguments) == ("code", {"key": task.meta["key"]})
            assert conv[2].content == conv[3].content == task.answer  # copied as it came
        else:
            assert re.fullmatch(r"maybe \d{4}", conv[1].content)
    assert 0.9 < np.mean(used[True]) < 1.0 and 0.2 < np.mean(used[False]) < 0.4
    cfg = load_config(recipe_path("mcp_tools"))
    longest = max(len(ids) for ids, _ in render_examples(ByteTokenizer(), convs))
    assert longest - 1 <= cfg.collector.max_episode_tokens <= cfg.engine.max_seq_len


def test_the_real_server_answers_what_the_demonstrations_say():
    suite = _suite()
    assert suite.tools == ()  # the recipe leaves the schemas out of the prompt
    agent = suite.make_agent()
    assert agent.tool_names == {"code"}  # listed from the server itself
    convs = suite.demos(40, 1)
    by_prompt = {t.prompt: t for t in suite.train_tasks}

    async def replay():
        rewards, results = [], []
        for conv in convs[:16]:
            task = by_prompt[conv[0].content]
            env = suite.make_env()
            await env.reset(task)
            result = None
            for msg in conv:
                if msg.role == "assistant":
                    action = (Action(text="", tool_calls=msg.tool_calls) if msg.tool_calls
                              else Action(text=msg.content, final_answer=msg.content))
                    result = await env.step(action)
                    if result.observation.tool_results:
                        results.append((result.observation.tool_results[0], conv[2].content))
            rewards.append(result.reward)
            await env.close()
        return rewards, results

    async def bad_key():
        env = suite.make_env()
        await env.reset(suite.train_tasks[0])
        step = await env.step(Action(text="", tool_calls=(
            ToolCall(name="code", arguments={"key": "zz999"}, id="x"),)))
        return step.observation.tool_results[0]

    rewards, results = asyncio.run(replay())
    assert results and all(r.ok and r.content == expected for r, expected in results)
    assert 0.25 <= np.mean(rewards) < 1.0 and set(rewards) == {0.0, 1.0}
    error = asyncio.run(bad_key())
    assert (error.ok, error.error) == (False, "tool_error") and "two letters" in error.content


MINI = [
    "sft.steps=2", "sft.batch_size=8", "sft.batch_tokens=0", "sft.num_demos=32", "run.steps=1",
    "tasks.num_train=64", "tasks.num_eval=4", "pipeline.group_size=2",
    "pipeline.groups_per_step=2", "pipeline.max_concurrency=8", "pipeline.filters=[]",
    "engine.max_slots=8", "eval.max_concurrency=8", "eval.samples=1", "tracing.console=false",
]


def test_miniature_train_runs_every_stage_with_the_server(tmp_path, capsys):
    status = main(["train", "mcp_tools", *MINI, f"run.runs_dir={tmp_path}", "run.name=mini"])
    err = capsys.readouterr().err
    assert status == 0, err[-3000:]
    summary = json.loads((tmp_path / "mini" / "summary.json").read_text())
    assert summary["rl_steps"] == 1
    assert summary["eval_after"]["eval/greedy/episodes"] == 4
    episodes = read_trace(tmp_path / "mini" / TRACE_FILENAME).spans_named(names.EPISODE)
    assert episodes and {s.args[names.ARG_STATUS] for s in episodes} <= {"ok", "truncated"}


@pytest.mark.slow
def test_recipe_learns_to_call_the_mcp_tool(tmp_path, capsys):
    """The full recipe (about a minute on two idle cores; docs/recipes.md has the runs)."""
    status = main(["train", "mcp_tools", f"run.runs_dir={tmp_path}", "run.name=mcp",
                   "tracing.console=false"])
    assert status == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((tmp_path / "mcp" / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["eval/sampled/success"] >= 0.85, after
    assert after["eval/greedy/success"] >= before["eval/greedy/success"] + 0.2, (before, after)
    assert after["eval/sampled/tool_use"] >= 0.95
