"""`agentax train frozen_lake`, the full recipe, on 64 held-out maps: the issue's goal, as is.
Held-out success after RL must reach 90% or at least double the warm start's, greedy and
sampled alike (docs/recipes.md has the measured figures). RL through the async pipeline is not
deterministic: greedy success ended 1-3 maps above 90% in most runs measured and one map below
it in one of three seed-0 runs.

Slow (about 2.5-3 minutes on two idle cores): CI runs it with the other `slow` tests.
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
        b, a = before[f"eval/{mode}/success"], after[f"eval/{mode}/success"]
        assert a >= 0.9 or a >= 2 * b, f"{mode}: {b:.3f} -> {a:.3f}"
