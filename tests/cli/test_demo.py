"""The embedded demo, shortened, end to end: SFT warm start, async GRPO, held-out evaluation.

The full SFT warm start (as `agentax train` runs it) and 16 of its 30 RL steps: 40-90 s on
two CPU cores, the price of checking that the out-of-the-box demo really learns; as a user runs
it, `agentax train` in a process of its own (tests/cli/test_run_api.py checks the library's
`train`, which the command calls). Marked slow:
`.ci/run` runs it after the default suite (tests/cli/test_commands.py keeps a short `agentax
train` run in the default suite).
"""

from __future__ import annotations

import json

import pytest

from tests.compile_flags import train_as_a_user


@pytest.mark.slow
def test_shortened_demo_improves_held_out_success(tmp_path):
    out = train_as_a_user([f"run.runs_dir={tmp_path}", "run.name=demo", "run.steps=16",
                           "tasks.num_eval=48", "tracing.console=false"])
    assert out.returncode == 0, out.stderr[-3000:]
    saved = json.loads((tmp_path / "demo" / "summary.json").read_text())
    before, after = saved["eval_before"], saved["eval_after"]
    # The warm start estimates most +/- answers in its head (never rewarded), greedy included;
    # RL learns to call the calculator on them.
    assert after["eval/sampled/success"] > before["eval/sampled/success"] + 0.1
    assert after["eval/greedy/success"] > before["eval/greedy/success"] + 0.1
    assert after["eval/greedy/tool_use"] > before["eval/greedy/tool_use"]
    assert after["eval/sampled/tool_use"] > before["eval/sampled/tool_use"]
    assert saved["rl_steps"] == 16 and (tmp_path / "demo" / "curves.png").stat().st_size > 0
