"""docs/recipes.md names every keyword parameter of every shipped recipe part."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
RECIPES = ("calculator", "frozen_lake", "math", "bash", "swe_tiny", "swe_real", "mcp_tools",
           "openai_calculator", "agents_sdk_calculator", "mini_swe", "web", "selfplay",
           "solver_verifier")
PARTS = ("make_env", "make_agent", "tasks", "demos", "random_player", "make_tool_env", "make_tool_agent",
         "arithmetic_tasks", "arithmetic_demos")
GIVEN = {"num_train", "num_eval", "seed", "train_tasks", "n", "kwargs"}  # set by the runner


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_part_parameter_is_documented(recipe):
    section = DOC.read_text().split("## Parts and their parameters", 1)[1].split("\n## ", 1)[0]
    module = importlib.import_module(f"agentax.recipes.{recipe}")
    missing = []
    for name in PARTS:
        fn = getattr(module, name, None)
        if fn is None or fn.__module__ != module.__name__:
            continue
        for param in inspect.signature(fn).parameters.values():
            if param.name not in GIVEN and f"`{param.name}`" not in section:
                missing.append(f"{name}({param.name})")
    assert not missing, f"docs/recipes.md does not describe {recipe}'s {missing}"
