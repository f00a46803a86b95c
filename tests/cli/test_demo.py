"""The embedded demo, shortened, end to end: SFT warm start, async GRPO, held-out evaluation.

The full SFT warm start (as `agentax train` runs it) and 16 of its 30 RL steps: 40-90 s on
two CPU cores, the price of checking that the out-of-the-box demo really learns. Marked slow:
`.ci/run` runs it after the default suite (tests/cli/test_commands.py keeps a short `agentax
train` run in the default suite).
"""

from __future__ import annotations

import json

import pytest

from agentax.cli import load_config
from agentax.run import train


@pytest.mark.slow
def test_shortened_demo_improves_held_out_success(tmp_path):
    cfg = load_config(None, [f"run.runs_dir={tmp_path}", "run.name=demo", "run.steps=16",
                             "tasks.num_eval=48", "tracing.console=false"])
    (tmp_path / "demo").mkdir()
    result = train(cfg, tmp_path / "demo", quiet=True)
    before, after = result.eval_before, result.eval_after
    # The warm start estimates most +/- answers in its head (never rewarded), greedy included;
    # RL learns to call the calculator on them.
    assert after["eval/sampled/success"] > before["eval/sampled/success"] + 0.1
    assert after["eval/greedy/success"] > before["eval/greedy/success"] + 0.1
    assert after["eval/greedy/tool_use"] > before["eval/greedy/tool_use"]
    assert after["eval/sampled/tool_use"] > before["eval/sampled/tool_use"]
    saved = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert saved["rl_steps"] == 16 == result.steps and (tmp_path / "demo" / "curves.png").stat().st_size > 0
