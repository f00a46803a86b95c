"""Shared helpers for environment tests: episodes run through the real `Collector.run_episode`
with a `ScriptedEngine` in the engine's place (the one episode loop there is)."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import pytest

from agentax.agents.testing import ScriptedEngine
from agentax.envs import ensure_async_env
from agentax.records import SamplingParams, StepResult, Task, Trajectory
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer


class Episode(NamedTuple):
    traj: Trajectory
    last: StepResult | None
    """The environment's last answer (its `info` is not part of the trajectory)."""
    engine: ScriptedEngine


def run_episode(env, agent, replies, task: Task, *, max_turns: int = 50, **config: Any) -> Episode:
    """One episode of `agent` in `env`, the model replying from `replies` (list or function)."""
    tokenizer = ByteTokenizer()
    engine = ScriptedEngine(replies, tokenizer=tokenizer)
    env = ensure_async_env(env)
    results: list[StepResult] = []
    step = env.step

    async def recording_step(action):
        result = await step(action)
        results.append(result)
        return result

    env.step = recording_step
    collector = Collector(
        engine, tokenizer, lambda: env, lambda: agent, SamplingParams(max_tokens=4096),
        CollectorConfig(**{"max_turns": max_turns, "max_episode_tokens": 1 << 20, **config}),
    )
    traj = asyncio.run(collector.run_episode(task, seed=0))
    assert engine.live_sequences == set(), "the collector left an engine sequence open"
    return Episode(traj, results[-1] if results else None, engine)


@pytest.fixture
def episode():
    """`episode(env, agent, replies, task)` runs one scripted episode through the collector."""
    return run_episode
