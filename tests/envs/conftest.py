"""Shared helpers for environment tests: a minimal scripted episode loop (not a collector)."""

from __future__ import annotations

import asyncio

import pytest

from agentax.envs import EnvError
from agentax.records import Task


async def run_episode(env, agent, model, task: Task, *, max_turns: int = 50):
    """Reset, then (model -> agent.act -> env.step -> agent.observe) until done.

    Returns (total_reward, last StepResult or None, EnvError or None)."""
    agent.reset(task)
    total = 0.0
    result = None
    try:
        agent.observe(await env.reset(task))
        for _ in range(max_turns):
            action = agent.act(model(agent.messages, tools=agent.tools))
            result = await env.step(action)
            total += result.reward
            if result.done:
                break
            agent.observe(result.observation)
    except EnvError as e:
        return total, result, e
    finally:
        await env.close()
    return total, result, None


@pytest.fixture
def episode():
    """`episode(env, agent, model, task)` runs one scripted episode to the end."""

    def run(env, agent, model, task, **kw):
        return asyncio.run(run_episode(env, agent, model, task, **kw))

    return run
