"""The swe_real recipe and the mini_swe recipe on SWE-bench-format instances.

mini-swe-agent's own harness (unchanged) runs a hand-written SWE-bench-format instance in the
sandbox through the engine's endpoint; the swe_real recipe's demonstrations score as the
SWE-bench check says; `agentax train swe_real run.steps=2` runs end to end (slow)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from agentax.cli import load_config, main
from agentax.run._build import build_suite_for
from agentax.envs import RepoSnapshots, load_swe_instances, swebench_tasks
from agentax.recipes import recipe_path, swe_real
from agentax.records import Action, ToolCall
from agentax.tools import check_sandbox_available
from tests.recipes.scripted import scripted_episode

DATA = Path(__file__).resolve().parents[1] / "data" / "swebench"


@pytest.fixture(autouse=True)
def _sandbox():
    try:
        check_sandbox_available()
    except Exception as e:  # noqa: BLE001 - a host without isolation
        pytest.skip(f"no sandbox on this host: {e}")


def _need_sdists():
    try:
        swe_real.instances()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def _block(command: str) -> str:
    return f"```mswea_bash_command\n{command}\n```"


@pytest.mark.parametrize("fixed", [True, False])
def test_mini_swe_agent_runs_a_swebench_instance_unchanged(fixed, tmp_path, monkeypatch):
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    pytest.importorskip("minisweagent")
    from agentax.recipes import mini_swe

    monkeypatch.setattr(mini_swe, "SWE_SNAPSHOTS", RepoSnapshots(cache_dir=tmp_path))
    inst = load_swe_instances(DATA / "instances.jsonl")[2]  # overlaps(): < must be <=
    (task,) = swebench_tasks([inst], instructions="")
    edit = "sed -i 's/a\\[0\\] < b\\[1\\] and b\\[0\\] < a\\[1\\]/a[0] <= b[1] and b[0] <= a[1]/' minicalc/ranges.py"
    replies = [_block(edit if fixed else "grep -n overlaps minicalc/ranges.py"), _block(mini_swe.SUBMIT)]
    traj = scripted_episode(mini_swe.make_env, mini_swe.make_agent, task, replies, max_tokens=160,
                            max_episode_tokens=2000)
    assert traj.reward == (1.0 if fixed else 0.0)
    assert (DATA / "minicalc" / "minicalc" / "ranges.py").read_text().count("a[0] < b[1]") == 1  # untouched


def test_swe_real_demonstrations_score_by_the_swebench_check():
    _need_sdists()
    suite = build_suite_for(load_config(recipe_path("swe_real"), ["tasks.num_eval=4"]))
    assert len(suite.train_tasks) >= 46 and len(suite.eval_tasks) == 4
    assert not {t.id for t in suite.train_tasks} & {t.id for t in suite.eval_tasks}
    convs = suite.demos(40, 3)
    right = next(c for c in convs if c[1].tool_calls[0].arguments["old"] != c[1].tool_calls[0].arguments["new"])
    wrong = next(c for c in convs if c[1].tool_calls[0].arguments["old"] == c[1].tool_calls[0].arguments["new"])

    async def replay(conv):
        task = next(t for t in suite.train_tasks if t.prompt == conv[0].content)
        env = suite.make_env()
        try:
            await env.reset(task)
            call: ToolCall = conv[1].tool_calls[0]
            step = await env.step(Action(text="", tool_calls=(call,)))
            assert step.observation.tool_results[0].ok, step.observation.tool_results[0].content
            return await env.step(Action(text="Fixed.", final_answer="Fixed."))
        finally:
            await env.close()

    assert asyncio.run(replay(right)).reward == 1.0
    missed = asyncio.run(replay(wrong))
    assert missed.reward == 0.0 and missed.info["swe_status"] == "unresolved"


# The recipe as shipped, made small (the test is the loop end to end, not learning): two of the
# faster-scoring packages (inflection's and parse's suites run in ~0.6 s, cachetools' in ~1.2 s),
# a 2-step warm start, one trainer sequence bucket (one compile), and a greedy-only evaluation
# on 2 held-out tasks: the recipe's 8 tasks x (1 greedy + 8 sampled), before and after
# training, were 144 scored episodes, ~10 minutes in a loaded CI stage. A warm start this short
# solves no task, so GRPO would drop every group (all rewards 0) and collect forever:
# pipeline.filters=[] trains on them (zero advantage), 2 groups of 4 per step.
SMALL = ["tasks.num_eval=2", "tasks.kwargs.packages=[inflection, parse]", "eval.samples=0",
         "sft.steps=2", "sft.num_demos=16", "trainer.min_seq_bucket=1024", "pipeline.filters=[]",
         "pipeline.group_size=4", "pipeline.groups_per_step=2"]


@pytest.mark.slow
def test_agentax_train_swe_real_runs_end_to_end(tmp_path, capsys):
    _need_sdists()
    status = main(["train", "swe_real", "run.steps=2", *SMALL, f"run.runs_dir={tmp_path}", "run.name=r",
                   "tracing.console=false"])
    out = capsys.readouterr()
    assert status == 0, out.err[-3000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and summary["trajectories_trained"] >= 8
