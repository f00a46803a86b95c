"""Every shipped recipe's resolved config, pinned: a change to the embedded demo's defaults
names the recipes that inherit it.

A recipe YAML sets what its task needs and inherits every other field from `RunConfig()` (the
demo). Tuning the demo therefore silently retunes each recipe that does not set the field
(a demo-only `sft.batch_tokens` once broke frozen_lake's SFT). `resolved_configs.yaml` holds
the demo's fields and, per recipe, the fields where it differs from the demo. When a change
is intended, regenerate the file and review its diff:

    AGENTAX_UPDATE_RESOLVED=1 .venv/bin/python -m pytest tests/recipes/test_resolved_configs.py
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import yaml

from agentax.cli import RunConfig, load_config
from agentax.config import to_dict
from agentax.recipes import RECIPES, recipe_path

SNAPSHOT = Path(__file__).with_name("resolved_configs.yaml")


def _flat(cfg) -> dict:
    return {f"{section}.{field}": value for section, fields in to_dict(cfg).items()
            for field, value in fields.items()}


def _current() -> dict:
    demo = _flat(RunConfig())
    recipes = {}
    for name in RECIPES:
        flat = _flat(load_config(recipe_path(name)))
        recipes[name] = {k: v for k, v in flat.items() if v != demo[k]}
    return {"demo": demo, "recipes": recipes}


def _changes(old: dict, new: dict) -> list[str]:
    return [f"{k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}"
            for k in sorted(set(old) | set(new)) if old.get(k, object()) != new.get(k, object())]


def _problems(pinned: dict, now: dict) -> list[str]:
    out = []
    for line in _changes(pinned["demo"], now["demo"]):
        key = line.split(":")[0]
        heirs = [n for n in now["recipes"] if n != "calculator" and key not in now["recipes"][n]]
        out.append(f"demo default {line}; inherited by: {', '.join(heirs) or 'no recipe'}")
    for name in sorted(set(pinned["recipes"]) | set(now["recipes"])):
        for line in _changes(pinned["recipes"].get(name, {}), now["recipes"].get(name, {})):
            out.append(f"recipe {name}: {line}")
    return out


def test_recipes_resolve_as_pinned():
    now = _current()
    if os.environ.get("AGENTAX_UPDATE_RESOLVED"):
        SNAPSHOT.write_text("# Written by tests/recipes/test_resolved_configs.py; see its "
                            "docstring.\n" + yaml.safe_dump(now, sort_keys=True))
    problems = _problems(yaml.safe_load(SNAPSHOT.read_text()), now)
    assert not problems, (
        "resolved configs changed (set the field in a recipe that must keep its value, then "
        "regenerate as the module docstring says):\n  " + "\n  ".join(problems))


def test_a_changed_demo_default_names_the_recipes_that_inherit_it():
    pinned = yaml.safe_load(SNAPSHOT.read_text())
    now = copy.deepcopy(pinned)
    now["demo"]["sft.batch_tokens"] += 1  # as if the demo's default had been retuned
    heirs = [n for n in RECIPES
             if n != "calculator" and "sft.batch_tokens" not in now["recipes"][n]]
    assert _problems(pinned, now) == [
        f"demo default sft.batch_tokens: {pinned['demo']['sft.batch_tokens']!r} -> "
        f"{pinned['demo']['sft.batch_tokens'] + 1!r}; inherited by: {', '.join(heirs)}"]
    assert "frozen_lake" not in heirs  # it sets batch_tokens: 0 itself
    now["recipes"]["bash"]["run.steps"] = -1
    assert _problems(pinned, now)[-1].startswith("recipe bash: run.steps: ")
