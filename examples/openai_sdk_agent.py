"""Train an agent written only against the `openai` SDK, unchanged, on the calculator task.

`agentax.recipes.openai_calculator.calculator_agent` is a plain chat-completions tool loop
(`client.chat.completions.create(..., tools=[calculator])`, run the calls, send the results,
stop at an answer). `OpenAIAgentEnvironment` points its `client` at the engine's own endpoint,
one session per episode, and hands the collector each episode as a token-exact trajectory.
Everything else is the ordinary pipeline: SFT warm start on the sloppy demonstrator, then
async GRPO, held-out success before and after. `--native` trains the native `ToolAgent` on the
same prompts and settings instead, for comparison (docs/openai.md has both).

Run: python examples/openai_sdk_agent.py [--native] [--quick]
"""

import argparse
import asyncio
import dataclasses
import json
import time

import numpy as np
from flax import nnx

from agentax.agents import ToolAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import ToolEnvironment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import SamplingParams
from agentax.recipes import calculator_demos, calculator_reward, calculator_tasks, openai_calculator
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer, render_conversation
from agentax.tools import calculator
from agentax.train import RLTrainer, SFTTrainer, TrainerConfig

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4,
                         num_kv_heads=2, head_dim=32)
SCHEMA = openai_calculator.CALCULATOR_TOOL["function"]
TOOL = dataclasses.replace(calculator, description=SCHEMA["description"], parameters=SCHEMA["parameters"])
LIMITS = CollectorConfig(max_turns=3, max_episode_tokens=360, model_timeout_s=120, episode_timeout_s=300)
TRAINER = TrainerConfig(learning_rate=2e-4, micro_batch_size=32, max_seq_len=384, min_seq_bucket=384,
                        off_policy="tis", is_cap=2.0)


def parts(native: bool):
    """(env factory, agent factory). The SDK agent ignores the agent factory: it is its own agent."""
    if native:
        return (lambda: ToolEnvironment([TOOL], calculator_reward, max_steps=3),
                lambda: ToolAgent([TOOL], system_prompt=""))
    return openai_calculator.make_env, lambda: ToolAgent([TOOL])


def warm_start(model, tok, train, steps):
    """SFT on the sloppy demonstrator, rendered with the tool listed (as both agents prompt)."""
    demos = calculator_demos([train[i % len(train)] for i in range(steps * 48)], seed=1)
    rows = [render_conversation(tok, d, tools=[{"type": "function", "function": SCHEMA}]) for d in demos]
    sft = SFTTrainer(model, dataclasses.replace(
        TRAINER, learning_rate=3e-3, warmup_steps=10, micro_batch_size=16, pack=True, pack_length=768,
        off_policy="none", is_cap=None))
    for i in range(steps):
        sft.step([(r.token_ids, r.assistant_mask) for r in rows[i * 48:(i + 1) * 48]])
    return sft.export_model()


def success(engine, tok, native, tasks, temperature) -> float:
    env, agent = parts(native)
    col = Collector(engine, tok, env, agent, SamplingParams(temperature=temperature, max_tokens=64), LIMITS)

    async def run():
        gate = asyncio.Semaphore(32)

        async def one(i, task):
            async with gate:
                return await col.run_episode(task, seed=1000 + i)
        return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))

    return float(np.mean([t.reward > 0 for t in asyncio.run(run())]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--native", action="store_true", help="train the native ToolAgent instead")
    ap.add_argument("--quick", action="store_true", help="a few steps (CI smoke run)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    tok = ByteTokenizer()
    tasks = calculator_tasks(4064, seed=0)
    train, held = tasks[:4000], tasks[4000:]
    model = warm_start(Transformer(MODEL, rngs=nnx.Rngs(0)), tok, train, 4 if args.quick else 170)
    engine = Engine(model, EngineConfig(max_slots=32, max_seq_len=384, prefill_chunk=64,
                                        min_prefill_bucket=32, decode_steps_per_call=8),
                    eos_token_ids=tok.eos_token_ids, tokenizer=tok)
    try:
        before = {"greedy": success(engine, tok, args.native, held, 0.0),
                  "sampled": success(engine, tok, args.native, held, 1.0)}
        env, agent = parts(args.native)
        collector = Collector(engine, tok, env, agent, SamplingParams(temperature=1.0, max_tokens=64), LIMITS)
        trainer = RLTrainer(model, TRAINER)
        pipeline = Pipeline(collector, trainer, engine, train, PipelineConfig(
            mode="async", max_staleness=1, group_size=8, groups_per_step=4, max_concurrency=32,
            # a smoke run's barely warmed policy gets all-zero groups: train on them anyway
            filters=() if args.quick else ("all_equal_rewards",)))
        result = pipeline.run(2 if args.quick else 40)
        after = {"greedy": success(engine, tok, args.native, held, 0.0),
                 "sampled": success(engine, tok, args.native, held, 1.0)}
    finally:
        engine.shutdown()
    print(json.dumps({"agent": "native" if args.native else "openai_sdk", "before": before, "after": after,
                      "rl_steps": len(result.steps), "trajectories_per_s": round(result.trajectories_per_s, 2),
                      "wall_s": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
