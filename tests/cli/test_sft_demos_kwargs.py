"""sft.demos takes keyword arguments (sft.demos_kwargs), like env, agent and tasks factories."""

from __future__ import annotations

from agentax.cli import load_config
from agentax.run._build import build_suite_for, resolve_config
from agentax.records import Message


def demos(train_tasks, n, seed, *, greeting="hi"):
    return [[Message(role="user", content=f"{greeting} {train_tasks[i % len(train_tasks)].id}"),
             Message(role="assistant", content="ok")] for i in range(n)]


def test_demos_kwargs_reach_the_demonstrator():
    cfg = resolve_config(load_config(None, ["sft.demos=tests.cli.test_sft_demos_kwargs:demos",
                                            "sft.demos_kwargs={greeting: hello}"]))
    convs = build_suite_for(cfg).demos(3, 0)
    assert len(convs) == 3 and all(c[0].content.startswith("hello ") for c in convs)


def test_naming_another_demonstrator_drops_the_old_kwargs(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("sft:\n  demos: tests.cli.test_sft_demos_kwargs:demos\n"
                    "  demos_kwargs: {greeting: hello}\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: base.yaml\nsft:\n  demos: agentax.recipes.calculator:demos\n")
    assert dict(load_config(child).sft.demos_kwargs) == {}
    assert dict(load_config(base).sft.demos_kwargs) == {"greeting": "hello"}
