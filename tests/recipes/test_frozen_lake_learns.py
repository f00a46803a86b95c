"""`agentax train frozen_lake`, the full recipe, on 64 held-out maps.

The issue's goal is that held-out success after RL reaches 90% or at least doubles the warm
start's, greedy and sampled alike; docs/recipes.md has the measured runs. RL through the async
pipeline is not deterministic: greedy success (warm start 64.1% on seed 0, so only the 90% arm
can be met) ended at 93.8, 89.1 and 93.8% in three seed-0 runs, one map under 90% in one of
them. A CI test that fails one run in three would block every change, so this test asserts the
goal for sampled success (it doubles, with a wide margin) and, for greedy success, a margin
under the goal that every measured run cleared: >= 85% and a rise of at least 15 points. It
still fails if RL stops improving the policy (the warm start is 64.1 / 29.7%).

Slow (about 2.5-3 minutes on two idle cores): CI runs it with the other `slow` tests.
"""

from __future__ import annotations

import json

import pytest

from agentax.cli import main


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~320 s alone on two idle cores, 400-600+ s beside another learning run
def test_frozen_lake_recipe_learns_held_out_maps(tmp_path, capsys):
    status = main(["train", "frozen_lake", f"run.runs_dir={tmp_path}", "run.name=fl",
                   "tracing.console=false"])
    assert status == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((tmp_path / "fl" / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    for mode in ("greedy", "sampled"):
        assert after[f"eval/{mode}/episodes"] >= 64
    b, a = before["eval/sampled/success"], after["eval/sampled/success"]
    assert a >= 0.9 or a >= 2 * b, f"sampled: {b:.3f} -> {a:.3f}"
    b, a = before["eval/greedy/success"], after["eval/greedy/success"]
    assert a >= 0.85 and a >= b + 0.15, f"greedy: {b:.3f} -> {a:.3f}"
