"""The mini_swe recipe, with the real mini-swe-agent package (`mini-swe-agent`).

mini-swe-agent's own `DefaultAgent` and `LitellmTextbasedModel` run through
`OpenAIAgentEnvironment` and the engine's endpoint on loopback, with a scripted engine, their
commands in agentax's sandbox: an episode must be, token for token and mask bit for mask bit,
the demonstration as the warm start renders it, and its reward what the commands left in the
sandbox; the harness's own ways of ending (format errors, its step limit, the endpoint's spent
budget) are trainable outcomes; the full recipe learns (slow, as a user runs it).
"""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # no banner on stdout at import
pytest.importorskip("minisweagent")

from agentax.cli import load_config  # noqa: E402
from agentax.run._build import build_suite_for  # noqa: E402
from agentax.recipes import bash, mini_swe, recipe_path, render_examples  # noqa: E402
from agentax.records import TrajectoryStatus  # noqa: E402
from agentax.text import ByteTokenizer  # noqa: E402
from agentax.tools import Sandbox, check_sandbox_available  # noqa: E402
from tests.recipes.scripted import recipe_suite, scripted_episode  # noqa: E402

RECIPE = "mini_swe"


@pytest.fixture(autouse=True)
def _sandbox():
    try:
        check_sandbox_available()
    except Exception as e:  # noqa: BLE001 - a host without isolation
        pytest.skip(f"no sandbox on this host: {e}")


def _suite():
    return recipe_suite(RECIPE)


def _episode(suite, task, replies, max_episode_tokens=380):
    return scripted_episode(suite.make_env, suite.make_agent, task, replies, max_tokens=96,
                            max_episode_tokens=max_episode_tokens)


def _block(command: str) -> str:
    return f"```mswea_bash_command\n{command}\n```"


def _right(task) -> str:
    return bash._KINDS[task.meta["kind"]][1].format(w=task.meta.get("word"))


def _task_of(suite, demo):
    return next(t for t in suite.train_tasks if t.prompt == demo[1].content)


def test_harness_episode_is_the_warm_start_rendering_token_for_token():
    suite = _suite()
    cfg = load_config(recipe_path(RECIPE))
    tok = ByteTokenizer()
    demos = suite.demos(60, 1)

    def command(demo):
        return demo[2].content.split("\n")[1]

    # a right command on an input file; a near miss on one; an echo near miss, which prints its
    # word (the observation carries the sandbox's output)
    right = next(d for d in demos if "files" in _task_of(suite, d).meta
                 and command(d) == _right(_task_of(suite, d)))
    wrong = next(d for d in demos if "files" in _task_of(suite, d).meta
                 and command(d) != _right(_task_of(suite, d)))
    echo = next(d for d in demos if _task_of(suite, d).meta["kind"] == "echo"
                and command(d) != _right(_task_of(suite, d)))
    assert echo[3].content.endswith(f"{_task_of(suite, echo).meta['word']}\n</output>")
    for demo, reward in ((right, 1.0), (wrong, 0.0), (echo, 0.0)):
        task = _task_of(suite, demo)
        traj = _episode(suite, task, [m.content for m in demo if m.role == "assistant"],
                        cfg.collector.max_episode_tokens)
        (ids, mask), = render_examples(tok, [demo], tools=list(suite.tools))
        # The demonstration's rendering ends with the newline after the last <|im_end|>.
        np.testing.assert_array_equal(traj.token_ids, ids[:-1])
        np.testing.assert_array_equal(traj.loss_mask, mask[:-1])
        assert traj.status == TrajectoryStatus.OK and traj.reward == reward, (demo, traj.info)
        assert traj.info["segment_breaks"] == 0 and traj.info["turns"] == 2


def test_harness_outcomes_are_trainable():
    suite = _suite()
    task = next(t for t in suite.train_tasks if t.meta["kind"] == "sort")
    right = _block(_right(task))
    # the right command, never submitted: the harness's step limit ends it, unrewarded
    unsubmitted = _episode(suite, task, [right] * 3, max_episode_tokens=1000)
    # no command block: the harness drops the reply and sends its format message (a new
    # segment each time), then exits after three in a row
    no_block = _episode(suite, task, ["sorted!"] * 3)
    # a format error, then the right command and the submit: recovers, rewarded (the new
    # segment is a new engine sequence, so the script answers by what the sequence holds)
    recovers = _episode(suite, task, lambda text: (
        _block(mini_swe.SUBMIT) if "<returncode>" in text
        else right if "EXACTLY ONE action" in text else "sorted!"))
    # the budget cuts the episode short: the endpoint's 400 ends it, truncated
    cut = _episode(suite, task, [right] * 3, max_episode_tokens=260)
    # a command that fails in the sandbox: its return code comes back, and the episode goes on
    failing = _episode(suite, task, [_block("cat nothere.txt"), _block(mini_swe.SUBMIT)])
    for traj in (unsubmitted, no_block, recovers, cut, failing):
        assert traj.status in (TrajectoryStatus.OK, TrajectoryStatus.TRUNCATED), traj.info
        assert traj.num_generated > 0
    assert unsubmitted.status == TrajectoryStatus.OK and unsubmitted.reward == 0.0
    assert unsubmitted.info["turns"] == 3 and unsubmitted.info["segment_breaks"] == 0
    assert no_block.reward == 0.0 and no_block.info["segment_breaks"] == 2
    assert recovers.reward == 1.0 and recovers.info["segment_breaks"] == 1
    assert cut.status == TrajectoryStatus.TRUNCATED and cut.reward == 0.0
    assert cut.info["reason"] == "max_episode_tokens=260"
    assert failing.reward == 0.0 and failing.info["turns"] == 2
    observation = ByteTokenizer().decode(failing.token_ids[failing.loss_mask == 0])
    assert "<returncode>1</returncode>" in observation and "nothere.txt" in observation


def test_commands_run_in_the_sandbox():
    from minisweagent.exceptions import Submitted

    async def main():
        loop = asyncio.get_running_loop()
        with Sandbox(mini_swe.SANDBOX, files={"in.txt": "b\na\n"}) as sandbox:
            env = mini_swe.sandbox_environment(sandbox, loop)
            run = lambda cmd: env.execute({"command": cmd})  # noqa: E731
            sort = await asyncio.to_thread(run, "sort in.txt > out.txt; pwd; cat /etc/hostname")
            assert sandbox.read_file("out.txt") == "a\nb\n"
            with pytest.raises(Submitted):
                await asyncio.to_thread(run, mini_swe.SUBMIT)
            return sort, sandbox.sandbox_workdir

    sort, workdir = asyncio.run(main())
    assert sort["returncode"] == 0 and sort["output"].startswith(workdir + "\n")


def test_recipe_lengths_fit_its_longest_demonstration():
    cfg = load_config(recipe_path(RECIPE))
    suite = build_suite_for(cfg)
    assert suite.tools == ()  # the text-based model sends no tool list
    longest = max(len(ids) for ids, _ in render_examples(ByteTokenizer(), suite.demos(2000, 1)))
    assert longest - 1 <= cfg.collector.max_episode_tokens <= cfg.engine.max_seq_len
    assert cfg.engine.max_seq_len <= cfg.trainer.max_seq_len
    assert cfg.sft.pack_length >= longest


@pytest.mark.slow
def test_recipe_learns_through_mini_swe_agent(tmp_path):
    """The full recipe as a user runs it (~440 CPU-seconds: ~4 minutes on two idle cores), in a
    process of its own (mini-swe-agent and LiteLLM set process-wide state at import)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "agentax", "train", RECIPE,
                          f"run.runs_dir={tmp_path}", "run.name=mini", "-q"],
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "mini" / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    # greedy 67.2 -> 100 % and 76.6 -> 100 %, sampled 62.5 -> 78.1 % and 70.3 -> 85.9 % (seeds 0
    # and 1; docs/recipes.md has the runs):
    # RL must lift both clearly, from whatever the warm start gave.
    assert after["eval/greedy/success"] >= max(0.9, before["eval/greedy/success"] + 0.1), (before, after)
    assert after["eval/sampled/success"] >= before["eval/sampled/success"] + 0.08, (before, after)
    # seed 1 at load ~60 had one ENV_ERROR episode of 904 (cause not found yet): rare, not none
    acct = summary["accounting"]
    assert acct["failed"].get("env_error", 0) <= 0.01 * acct["started"], acct
