"""agentax.recipes: shipped YAML run recipes and the parts they name by import path.

* `RECIPES` / `recipe_path(name)`: the YAML run configs shipped with agentax
  (`agentax train NAME`; see docs/recipes.md).
* `agentax.recipes.calculator`: the embedded CPU demo's environment, agent, tasks and sloppy
  demonstrator; `agentax.recipes.math`: math with the calculator tool.
* `load_tasks(path)` (JSONL / Parquet tasks), `load_demos_jsonl(path)` (chat demonstrations),
  `PromptToolAgent`, and the calculator helpers (`calculator_tasks`, `calculator_demos`, ...).
"""

from pathlib import Path

from agentax.recipes._calculator import (
    CALCULATOR_OPS,
    DemoMix,
    calculator_demos,
    calculator_reward,
    calculator_tasks,
    compact_calculator,
)
from agentax.recipes._tasks import PromptToolAgent, load_demos_jsonl, load_tasks

RECIPE_DIR = Path(__file__).parent / "configs"
"""Folder of the shipped YAML recipes."""

RECIPES = tuple(sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")))
"""Names of the shipped recipes (`agentax train NAME` runs one)."""


def recipe_path(name: str) -> Path:
    """The YAML file of a shipped recipe.

    Raises:
      ValueError: no recipe has that name (the message lists them).
    """
    path = RECIPE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"no recipe named {name!r}; shipped recipes: {', '.join(RECIPES)}")
    return path


__all__ = [
    "CALCULATOR_OPS",
    "DemoMix",
    "PromptToolAgent",
    "RECIPES",
    "RECIPE_DIR",
    "calculator_demos",
    "calculator_reward",
    "calculator_tasks",
    "compact_calculator",
    "load_demos_jsonl",
    "load_tasks",
    "recipe_path",
]
