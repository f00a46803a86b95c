"""The web recipe's parts in a real Chromium: the demonstrator reads real MiniWoB++ pages right,
the compact view keeps what it needs, and held-out seeds are other instances."""

from __future__ import annotations

import asyncio

import pytest

from agentax.envs import BrowserUnavailableError, check_browser_available, shutdown_browser
from agentax.records import Action
from agentax.recipes import web

try:
    check_browser_available()
    from agentax.envs._miniwob import miniwob_dir

    miniwob_dir()
except BrowserUnavailableError as e:  # pragma: no cover - depends on the host
    pytest.skip(f"browser unavailable: {e}", allow_module_level=True)


def test_scripted_demonstrator_solves_every_recipe_page():
    train, held = web.tasks(num_train=8, num_eval=8, seed=0)
    assert not {t.id for t in train} & {t.id for t in held}

    async def go():
        env = web.make_env()
        agent = web.make_agent()
        rewards, views = [], []
        for task in train:
            obs = await env.reset(task)
            agent.reset(task)
            (msg,) = agent.observe(obs)
            views.append(msg.content)
            target = web.scripted_target(obs.content)
            assert target is not None, obs.content
            r = await env.step(agent.act(f"click {target}"))
            rewards.append(r.reward)
        bad = await env.reset(train[0])
        r = await env.step(Action(text="no idea"))
        assert r.observation.content.startswith("Invalid action") and not r.done
        await env.close()
        await shutdown_browser()
        return rewards, views, bad

    rewards, views, _ = asyncio.run(go())
    assert rewards == [1.0] * len(train)
    for view in views:  # the instruction, then one short line per control
        lines = view.splitlines()
        assert not lines[0][0].isdigit() and all(ln.split(" ", 1)[0].isdigit() for ln in lines[1:])
        assert len(view) < 120, view


def test_compact_view_keeps_feedback_and_controls():
    text = ('Invalid action: no action found\nClick on Tab #2.\n[1] tab "Tab #1"\nLorem ipsum\n'
            '[2] tab "Tab #2"\n[3] input text ""')
    assert web.compact_view(text) == "Invalid action: no action found\nClick on Tab #2.\n1 Tab #1\n2 Tab #2\n3 input"
    assert web.scripted_target(text) == 2


def test_the_shipped_recipe_trains_on_the_tiny_task_set():
    from agentax.cli import load_config
    from agentax.recipes import recipe_path

    cfg = load_config(recipe_path("web"))
    assert tuple(cfg.tasks.kwargs["names"]) == web.TINY_WEB_TASKS
    assert set(web.TINY_WEB_TASKS) < set(web.WEB_TASKS)
