"""`agentax train frozen_lake`, the full recipe, on 64 held-out maps: sampled success must reach
90% or at least double the warm start (measured 37.5% -> 87.5%), and greedy success must not fall
(measured 75.0% -> 85.9%). The issue's goal asks the same of greedy; the recipe does not reach it
yet (docs/recipes.md), so this test holds what the recipe does and fails if it stops learning.

Slow (a few minutes on two idle cores): CI runs it with the other `slow` tests.
"""

from __future__ import annotations

import json

import pytest

from agentax.cli import main


@pytest.mark.slow
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
    assert a >= b, f"greedy: {b:.3f} -> {a:.3f}"
