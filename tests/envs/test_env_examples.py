"""Every example in examples/ runs to the end (each asserts its own reward) in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def test_the_expected_examples_exist():
    assert {
        "math_single_turn.py", "calculator_tool.py", "frozen_lake_agent.py",
        "gymnasium_wrapper.py", "bash_task.py", "swe_task.py",
    } <= set(SCRIPTS)  # fmt: skip


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, script], cwd=EXAMPLES, capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "episode failed" not in proc.stdout
    assert "reward" in proc.stdout
