"""A recipe's parts, and one episode of them driven by a scripted engine (the black-box
recipes' token-for-token tests: openai_calculator, agents_sdk_calculator, mini_swe)."""

from __future__ import annotations

import asyncio

from agentax.agents.testing import ScriptedEngine
from agentax.cli import load_config
from agentax.run._build import build_suite_for
from agentax.recipes import recipe_path
from agentax.records import SamplingParams
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer


def recipe_suite(name: str):
    """The recipe's built parts, with a small task set."""
    return build_suite_for(load_config(recipe_path(name), ["tasks.num_train=200",
                                                           "tasks.num_eval=4"]))


def scripted_episode(env_factory, agent_factory, task, replies, *, max_tokens: int,
                     max_episode_tokens: int):
    """One episode whose model replies are `replies` (a list, or a function of the prompt);
    checks the engine holds no sequence afterwards."""
    tok = ByteTokenizer()
    engine = ScriptedEngine(replies, tokenizer=tok)
    collector = Collector(engine, tok, env_factory, agent_factory,
                          SamplingParams(temperature=1.0, max_tokens=max_tokens),
                          CollectorConfig(max_turns=3, max_episode_tokens=max_episode_tokens))
    traj = asyncio.run(collector.run_episode(task, seed=1, group_id="g"))
    assert not engine.live_sequences
    return traj
