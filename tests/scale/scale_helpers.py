"""Shared pieces for the scale tests: a tiny real model, engines and a collector."""

from __future__ import annotations

import asyncio

from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.models import ModelConfig, Transformer
from agentax.records import SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer

MODEL = ModelConfig.tiny(
    num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1, head_dim=32
)
ENGINE_CONFIG = EngineConfig(max_slots=8, max_seq_len=128, prefill_chunk=64, decode_steps_per_call=2)
TOKENIZER = ByteTokenizer()


def make_model(seed: int = 0) -> Transformer:
    return Transformer(MODEL, rngs=nnx.Rngs(seed))


def make_engine(model: Transformer, config: EngineConfig = ENGINE_CONFIG, **kw) -> Engine:
    return Engine(model, config, eos_token_ids=TOKENIZER.eos_token_ids, tokenizer=TOKENIZER, **kw)


def make_collector(engine, env_factory, *, max_tokens: int = 6, max_turns: int = 4) -> Collector:
    return Collector(
        engine, TOKENIZER, env_factory, lambda: ModelAgent(system_prompt=None),
        SamplingParams(temperature=1.0, max_tokens=max_tokens),
        CollectorConfig(max_turns=max_turns, max_episode_tokens=120, model_timeout_s=60,
                        episode_timeout_s=60),
    )


def run_episodes(collector: Collector, tasks: list[Task], *, concurrency: int, during=None):
    """Runs one episode per task (at most `concurrency` at once); `during` runs alongside."""

    async def main():
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int, task: Task):
            async with gate:
                return await collector.run_episode(task, seed=i, group_id=f"g{i}", sample_index=0)

        side = asyncio.create_task(during()) if during is not None else None
        trajs = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
        if side is not None:
            await side
        return trajs

    return asyncio.run(main())
