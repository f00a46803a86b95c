"""The shipped recipes' parts: demonstrations replayed in the real environments earn reward,
held-out tasks are disjoint from training tasks, and every recipe is listed and loads."""

from __future__ import annotations

import asyncio

import pytest

from agentax.cli import load_config
from agentax.run._build import build_suite_for
from agentax.recipes import RECIPES, recipe_path
from agentax.records import Action
from agentax.tools import SandboxUnavailableError, check_sandbox_available

TINY = ("bash", "calculator", "frozen_lake", "math", "mcp_tools", "swe_tiny")


def _sandbox():
    try:
        check_sandbox_available()
    except SandboxUnavailableError as e:
        pytest.skip(f"no sandbox here: {e}")


def test_every_tiny_recipe_is_shipped_and_loads():
    assert set(TINY) <= set(RECIPES)
    for name in TINY:
        cfg = load_config(recipe_path(name))
        assert cfg.model == load_config(None).model  # the built-in tiny model


async def _replay(suite, conv, task):
    """Plays a demonstration's assistant turns in a fresh environment; returns the reward."""
    env, agent = suite.make_env(), suite.make_agent()
    agent.reset(task)
    agent.observe(await env.reset(task))
    total, result = 0.0, None
    try:
        for msg in conv:
            if msg.role != "assistant":
                continue
            if msg.tool_calls:
                action = Action(text="", tool_calls=msg.tool_calls)
            else:
                action = agent.act(msg.content)
            result = await env.step(action)
            total += result.reward
            if result.done:
                break
    finally:
        await env.close()
    return total, result


@pytest.mark.parametrize("name", ["frozen_lake", "math", "bash", "swe_tiny"])
def test_held_out_tasks_are_new_and_demonstrations_score(name):
    if name in ("bash", "swe_tiny"):
        _sandbox()
    cfg = load_config(recipe_path(name), ["tasks.num_train=40", "tasks.num_eval=8"])
    suite = build_suite_for(cfg)
    key = (lambda t: (t.prompt, str(t.meta.get("map")), str(t.meta.get("files"))))
    if name != "swe_tiny":  # three repositories: nothing to hold out (documented)
        assert not {key(t) for t in suite.train_tasks} & {key(t) for t in suite.eval_tasks}
    convs = suite.demos(24, 1)
    rewards = []
    for i, conv in enumerate(convs[:12]):
        total, _ = asyncio.run(_replay(suite, conv, suite.train_tasks[i % len(suite.train_tasks)]))
        rewards.append(total)
    # Noisy demonstrators: mostly right, sometimes wrong.
    assert 0.25 <= sum(r > 0 for r in rewards) / len(rewards) < 1.0 or name == "frozen_lake"
    assert max(rewards) == 1.0 and min(rewards) <= 0.0 + 1e-9 or name == "frozen_lake"


def test_frozen_lake_planner_reaches_every_goal_and_env_reports_metrics():
    from agentax.agents import FrozenLakeAgent
    from agentax.recipes import frozen_lake as fl

    cfg = load_config(recipe_path("frozen_lake"), ["tasks.num_train=20", "tasks.num_eval=20"])
    suite = build_suite_for(cfg)

    async def solve(task):
        env = suite.make_env()
        obs = await env.reset(task)
        desc, pos = task.meta["map"], (0, 0)
        for _ in range(10):
            a = fl.shortest_path_action(desc, pos)
            result = await env.step(Action(text="", value=a))
            assert FrozenLakeAgent().parse_reply(FrozenLakeAgent.action_name(a)).value == a
            pos = divmod(int(result.observation.raw), len(desc[0]))
            if result.done:
                return obs, result
        return obs, result

    for task in suite.eval_tasks:
        obs, result = asyncio.run(solve(task))
        assert result.reward == 1.0 and result.info["metrics"]["hole"] == 0.0
        assert "P" in obs.content and len(obs.content.splitlines()) == 8  # map + view ahead


def test_frozen_lake_view_ahead_and_planner_tie_break():
    from agentax.recipes import frozen_lake as fl

    desc = ["SFHF", "FFFH", "FFFF", "HHFG"]
    # The view ahead is the map from P down and right, '#' past the edge, always 4x4.
    assert fl.render(desc, (1, 1)).splitlines() == ["SFHF", "FPFH", "FFFF", "HHFG",
                                                     "PFH#", "FFF#", "HFG#", "####"]
    assert fl.render(desc, (3, 2)).splitlines()[4:] == ["PG##", "####", "####", "####"]
    # Of two equally short moves the planner takes the axis with more distance left.
    open_map = ["SFFF", "FFFF", "FFFF", "FFFG"]
    assert fl.shortest_path_action(open_map, (0, 0)) == 1  # 3 rows, 3 columns: down first
    assert fl.shortest_path_action(open_map, (2, 0)) == 2  # 1 row, 3 columns: right
    assert fl.shortest_path_action(open_map, (0, 2)) == 1  # 3 rows, 1 column: down
