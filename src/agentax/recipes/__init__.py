"""agentax.recipes: shipped YAML run recipes and the parts they name by import path.

* `RECIPES` / `recipe_path(name)`: the YAML run configs shipped with agentax
  (`agentax train NAME`; see docs/recipes.md).
* Modules named in those YAML files, each a user's-eye example of `env.factory`,
  `agent.factory`, `tasks.factory` and `sft.demos`: `agentax.recipes.calculator` (the embedded
  CPU demo), `.math`, `.frozen_lake`, `.bash`, `.swe_tiny`, `.mcp_tools` (a tool of a real MCP
  server, `agentax.recipes._mcp_server`), `.openai_calculator` (an `openai` SDK agent),
  `.agents_sdk_calculator` (an OpenAI Agents SDK agent) and `.mini_swe` (a mini-swe-agent
  agent, its commands in the sandbox).
* `load_tasks(path)` (JSONL / Parquet tasks), `load_demos_jsonl(path)` (chat demonstrations),
  `render_examples(tokenizer, demos, tools=..., instructions=...)` (SFT examples rendered with
  the tool list and system message the episodes' prompts carry), and the calculator task's
  `calculator_tasks`, `calculator_demos`, `calculator_reward`.
"""

from pathlib import Path

from agentax.recipes._calculator import calculator_demos, calculator_reward, calculator_tasks
from agentax.recipes._render import render_examples
from agentax.recipes._tasks import load_demos_jsonl, load_tasks

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
    "calculator_demos",
    "calculator_reward",
    "calculator_tasks",
    "load_demos_jsonl",
    "load_tasks",
    "recipe_path",
    "render_examples",
]
