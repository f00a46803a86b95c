"""Shared pieces for pipeline tests: a tiny real model, engine, trainer and environments."""

from __future__ import annotations

import asyncio
import random

import pytest
from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import Environment, TaskEnvironment
from agentax.models import ModelConfig, Transformer
from agentax.records import Observation, SamplingParams, StepResult, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig

MODEL = ModelConfig.tiny(
    num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1, head_dim=32
)
TASKS = [Task(id=f"t{i}", prompt=f"Say {w}.") for i, w in enumerate(["hi", "yes", "abc", "ok", "no", "hey"])]


def vowel_reward(task: Task, response: str) -> float:
    """Deterministic reward with variance across samples: share of vowels in the reply."""
    return sum(c in "aeiou" for c in response) / max(len(response), 1)


class Parts:
    """Model, engine, trainer and collector built fresh (same seeds) for one run."""

    def __init__(self, *, max_slots=8, env_factory=None, max_tokens=12, collector_config=None,
                 **trainer_kw):
        self.tok = ByteTokenizer()
        model = Transformer(MODEL, rngs=nnx.Rngs(0))
        self.engine = Engine(
            model, EngineConfig(max_slots=max_slots, max_seq_len=128, prefill_chunk=64,
                                decode_steps_per_call=2),
            eos_token_ids=self.tok.eos_token_ids, tokenizer=self.tok,
        )
        self.trainer = RLTrainer(
            model, TrainerConfig(**{"learning_rate": 3e-3, "micro_batch_size": 8, "max_seq_len": 128,
                                    "min_seq_bucket": 64, "off_policy": "tis", "is_cap": 2.0,
                                    **trainer_kw}),
        )
        self.collector = Collector(
            self.engine, self.tok,
            env_factory or (lambda: TaskEnvironment(vowel_reward)),
            lambda: ModelAgent(system_prompt=None),
            SamplingParams(temperature=1.0, max_tokens=max_tokens),
            collector_config or CollectorConfig(max_turns=2, max_episode_tokens=120,
                                                model_timeout_s=60, episode_timeout_s=60),
        )

    def close(self):
        self.engine.shutdown()


@pytest.fixture
def tasks():
    return TASKS


@pytest.fixture
def flaky_env():
    return FlakyEnv


@pytest.fixture
def make_parts():
    made = []

    def make(**kw):
        p = Parts(**kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


class FlakyEnv(Environment):
    """Multi-turn environment that raises, hangs, or returns garbage at random rates."""

    max_steps = 3
    step_timeout_s = 0.5
    reset_timeout_s = 0.5

    def __init__(self, rng: random.Random, *, p_raise=0.15, p_hang=0.1, p_garbage=0.1):
        super().__init__()
        self.rng = rng
        self.p = (p_raise, p_hang, p_garbage)

    async def _maybe_fail(self):
        r = self.rng.random()
        p_raise, p_hang, p_garbage = self.p
        if r < p_raise:
            raise RuntimeError("injected failure")
        if r < p_raise + p_hang:
            await asyncio.sleep(3600)
        if r < p_raise + p_hang + p_garbage:
            return "garbage"
        return None

    async def _reset(self, task):
        if await self._maybe_fail() == "garbage":
            return 42  # not an Observation
        return Observation(content=task.prompt)

    async def _step(self, action):
        if await self._maybe_fail() == "garbage":
            return {"not": "a StepResult"}
        reward = vowel_reward(self.task, action.text)
        return StepResult(observation=Observation(content="again"), reward=reward,
                          done=self.num_steps >= 2)
