"""The embedded demo, shortened, end to end: SFT warm start, async GRPO, held-out evaluation.

Slow (minutes on two shared CPU cores): run with `pytest -m slow tests/cli/test_demo.py`.
"""

from __future__ import annotations

import json

import pytest

from agentax.cli import load_config
from agentax.cli._runner import run_train


@pytest.mark.slow
def test_shortened_demo_improves_held_out_success(tmp_path):
    cfg = load_config(None, [f"run.runs_dir={tmp_path}", "run.name=demo", "run.steps=16",
                             "env.num_eval_tasks=48", "tracing.console=false"])
    summary = run_train(cfg, tmp_path / "demo", quiet=True)
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["eval/sampled/success"] > before["eval/sampled/success"] + 0.1
    assert after["eval/greedy/tool_rate"] > before["eval/greedy/tool_rate"]
    assert after["eval/sampled/tool_rate"] > before["eval/sampled/tool_rate"]
    saved = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert saved["rl_steps"] == 16 and (tmp_path / "demo" / "curves.png").stat().st_size > 0
