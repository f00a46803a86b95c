"""agentax.recipes: the built-in calculator task, task suites, and YAML run recipes.

* `calculator_tasks`, `calculator_demos`, `calculator_reward`, `used_tool`: the embedded CPU
  demo's multi-turn calculator-tool task and its (deliberately sloppy) warm-start demonstrations.
* `build_suite(name, ...) -> TaskSuite`: tasks + environment/agent factories for 'calculator',
  'math' (GSM8K-style, math_verify) and 'math_tool' (the same with the calculator tool).
* `RECIPES` / `recipe_path(name)`: YAML run configs shipped with agentax (see docs/quickstart.md).
"""

from pathlib import Path

from agentax.recipes._calculator import calculator_demos, calculator_reward, calculator_tasks, used_tool
from agentax.recipes._suite import (
    SUITES,
    TaskSuite,
    build_suite,
    load_demos_jsonl,
    load_math_jsonl,
)

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
    "RECIPES",
    "RECIPE_DIR",
    "SUITES",
    "TaskSuite",
    "build_suite",
    "calculator_demos",
    "calculator_reward",
    "calculator_tasks",
    "load_demos_jsonl",
    "load_math_jsonl",
    "recipe_path",
    "used_tool",
]
