"""Black-box SDK agent over the OpenAI endpoint vs the native ToolAgent, same engine and task.

Workload: the calculator task (tool listed in the prompt, at most 3 model calls an episode) on
the demo's model (~0.3M parameters, byte vocabulary), one real `Engine` (32 slots) shared by
both modes, the same `Collector` limits and sampling (temperature 1, ≤ 64 tokens a call).
32 episodes run concurrently in each mode. Native: `ToolAgent` + `ToolEnvironment`, the
collector calls the engine directly. Black box: `agentax.recipes.openai_calculator`, a plain
`openai.AsyncOpenAI` tool loop, through `OpenAIAgentEnvironment` (HTTP on loopback, in the same
process and event loop). The full run warm-starts the model with SFT on the calculator
demonstrations first, so that episodes are multi-turn (tool call, result, answer) like the
trained demo's; `--quick` uses the untrained model: every episode is one short call (~30
tokens), so the fixed cost of a call weighs most there, and its ratio is the pessimistic end
(the same per-call costs, less engine work to hide them behind). The modes alternate in pairs
after a warm-up that compiles every kernel; figures are medians over the pairs.

Figures (last line, JSON):
  black_box_over_native   trajectories/s of the black-box agent over the native one (goal ≥ 0.8)
  added_ms_p50 / _p99     per model call: the SDK client's round trip minus the engine's own
                          time for that call (submission to completion), in ms
  native_traj_per_s, black_box_traj_per_s, calls_per_episode_native / _black_box
  cpu_ms_per_traj_native / _black_box
                          process CPU time (all threads: engine, XLA, event loop) per trajectory,
                          a figure that a loaded machine disturbs less than the wall-clock ones
  stream_first_token_fraction
                          median time to the first streamed content piece over the median time
                          to the stream's end, for 64-token answers (goal ≤ 0.25): the SDK's
                          `stream=True` on loopback, one request at a time (16 in `--quick`, 64
                          in the full run, after 2 warm-up ones), on a second engine of the
                          same shapes (no recompilation) with no eos ids, so every answer is
                          exactly 64 tokens (9 engine calls: the prefill's first token, then
                          8 fused decode calls of 8)
  stream_first_token_ms_p50, stream_full_ms_p50, unstreamed_full_ms_p50 (the same request
  unstreamed), stream_pieces_per_answer (content deltas a stream carried)

Usage: python benchmarks/openai_endpoint.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import asyncio
import json
import os
import statistics
import sys
import time

import numpy as np
from flax import nnx

from agentax.agents import ToolAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import ToolEnvironment
from agentax.models import ModelConfig, Transformer
from agentax.records import SamplingParams
from agentax.recipes import calculator_demos, calculator_reward, calculator_tasks, openai_calculator
from agentax.rollout import Collector, CollectorConfig
from agentax.serve import ChatServer, OpenAIAgentEnvironment
from agentax.text import ByteTokenizer, render_conversation
from agentax.tools import calculator
from agentax.train import SFTTrainer, TrainerConfig

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4,
                         num_kv_heads=2, head_dim=32)
ENGINE = EngineConfig(max_slots=32, max_seq_len=384, prefill_chunk=64, min_prefill_bucket=32,
                      decode_steps_per_call=8, precompile=True)
SAMPLING = SamplingParams(temperature=1.0, max_tokens=64)
LIMITS = CollectorConfig(max_turns=3, max_episode_tokens=360, model_timeout_s=120,
                         episode_timeout_s=300)
CONCURRENCY = 32
SCHEMA = {"name": "calculator", "description": "Evaluates arithmetic.",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                         "required": ["expression"]}}
"""The calculator's full schema, listed in every prompt of both modes (the recipe's SDK agent
declares it by name only, to keep the tiny model's prompts short; this workload is unchanged)."""


def compact_calculator():
    """The native agent's calculator with the SDK agent's schema (identical prompts)."""
    return dataclasses.replace(calculator, description=SCHEMA["description"],
                               parameters=SCHEMA["parameters"])


def warm_start(model, tok, steps: int, seed: int = 0):
    """SFT on the sloppy calculator demonstrations, rendered with the tool listed."""
    tasks = calculator_tasks(1024, seed=seed + 100)
    schema = [compact_calculator().schema()]
    examples = []
    for conv in calculator_demos(tasks, seed=seed):
        r = render_conversation(tok, conv, tools=schema)
        examples.append((r.token_ids, r.assistant_mask))
    trainer = SFTTrainer(model, TrainerConfig(learning_rate=3e-3, warmup_steps=10, micro_batch_size=48,
                                              max_seq_len=384, min_seq_bucket=64,
                                              agg_mode="token-mean", off_policy="none"))
    for i in range(steps):
        trainer.step([examples[(i * 48 + j) % len(examples)] for j in range(48)])
    return trainer.export_model()


class TimedEnv(OpenAIAgentEnvironment):
    """The recipe's SDK agent with its client's per-call round trips recorded."""

    calls_ms: dict[str, list[float]] = {}

    def __init__(self):
        async def timed(client, task):
            create = client.chat.completions.create

            async def wrapped(**kw):
                t = time.perf_counter()
                out = await create(**kw)
                TimedEnv.calls_ms.setdefault(task.id, []).append((time.perf_counter() - t) * 1e3)
                return out

            client.chat.completions.create = wrapped
            return await openai_calculator.calculator_agent(
                client, task, tool={"type": "function", "function": SCHEMA})

        super().__init__(timed, reward_fn=calculator_reward)


async def run_mode(collector, tasks, n: int, offset: int):
    queue = list(range(n))
    out = []

    async def worker():
        while queue:
            i = queue.pop()
            task = tasks[(offset + i) % len(tasks)]
            out.append(await collector.run_episode(task, seed=offset + i))

    t, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return out, time.perf_counter() - t, time.process_time() - cpu


def added_ms(trajs) -> list[float]:
    """Client round trip minus the engine's time, call by call (turns are in call order)."""
    out = []
    for tr in trajs:
        client = TimedEnv.calls_ms.get(tr.task_id, [])
        if len(client) == len(tr.turns):
            out += [c - t.completion.total_time_s * 1e3 for c, t in zip(client, tr.turns)]
    return out


async def measure(engine, tok, tasks, episodes: int, pairs: int) -> dict:
    native = Collector(engine, tok, lambda: ToolEnvironment([compact_calculator()], calculator_reward,
                                                            max_steps=3),
                       lambda: ToolAgent([compact_calculator()], system_prompt=""), SAMPLING, LIMITS)
    black = Collector(engine, tok, TimedEnv, lambda: ToolAgent([compact_calculator()]), SAMPLING,
                      LIMITS)
    await run_mode(native, tasks, CONCURRENCY, 10_000)  # warm-up: compile, start the endpoint
    await run_mode(black, tasks, CONCURRENCY, 20_000)
    ratios, rates = [], {"native": [], "black_box": []}
    calls: dict[str, list[float]] = {"native": [], "black_box": []}
    cpu_ms: dict[str, list[float]] = {"native": [], "black_box": []}
    added: list[float] = []
    statuses: dict[str, int] = {}
    for p in range(pairs):
        order = [("native", native), ("black_box", black)]
        if p % 2:
            order.reverse()
        got = {}
        for name, col in order:
            TimedEnv.calls_ms = {}
            trajs, wall, cpu = await run_mode(col, tasks, episodes, p * episodes)
            got[name] = len(trajs) / wall
            cpu_ms[name].append(cpu * 1e3 / len(trajs))
            calls[name].append(sum(len(t.turns) for t in trajs) / len(trajs))
            for t in trajs:
                statuses[f"{name}:{t.status.value}"] = statuses.get(f"{name}:{t.status.value}", 0) + 1
            if name == "black_box":
                added += added_ms(trajs)
        for k, v in got.items():
            rates[k].append(v)
        ratios.append(got["black_box"] / got["native"])
    return {
        "black_box_over_native": round(statistics.median(ratios), 3),
        "added_ms_p50": round(float(np.percentile(added, 50)), 2) if added else None,
        "added_ms_p99": round(float(np.percentile(added, 99)), 2) if added else None,
        "native_traj_per_s": round(statistics.median(rates["native"]), 2),
        "black_box_traj_per_s": round(statistics.median(rates["black_box"]), 2),
        "calls_per_episode_native": round(statistics.mean(calls["native"]), 2),
        "calls_per_episode_black_box": round(statistics.mean(calls["black_box"]), 2),
        "cpu_ms_per_traj_native": round(statistics.median(cpu_ms["native"]), 2),
        "cpu_ms_per_traj_black_box": round(statistics.median(cpu_ms["black_box"]), 2),
        "pair_ratios": [round(r, 3) for r in ratios],
        "statuses": statuses,
    }


STREAM_TOKENS = 64


async def measure_stream(engine, tok, tasks, requests: int) -> dict:
    """Time to the first streamed content piece and to the stream's end, one request at a time,
    for answers of exactly `STREAM_TOKENS` tokens (`engine` has no eos ids), through the real
    SDK on loopback; the same requests unstreamed give the reference completion time."""
    import openai

    async with ChatServer(engine, tok) as server:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="bench", max_retries=0)
        first, full, plain, pieces = [], [], [], []
        for i in range(requests + 2):  # the first two warm the connection and the endpoint
            msgs = [{"role": "user", "content": tasks[i].prompt}]
            kw = dict(model="agentax", messages=msgs, max_tokens=STREAM_TOKENS, temperature=1.0,
                      seed=i)
            t = time.perf_counter()
            await client.chat.completions.create(**kw)
            t_plain = time.perf_counter() - t
            t, t_first, n = time.perf_counter(), None, 0
            async for ch in await client.chat.completions.create(**kw, stream=True):
                if ch.choices and ch.choices[0].delta.content:
                    n += 1
                    if t_first is None:
                        t_first = time.perf_counter() - t
            if i >= 2 and t_first is not None:
                first.append(t_first)
                full.append(time.perf_counter() - t)
                plain.append(t_plain)
                pieces.append(n)
        await client.close()
    return {
        "stream_first_token_fraction": round(statistics.median(first) / statistics.median(full), 3),
        "stream_first_token_ms_p50": round(statistics.median(first) * 1e3, 2),
        "stream_full_ms_p50": round(statistics.median(full) * 1e3, 2),
        "unstreamed_full_ms_p50": round(statistics.median(plain) * 1e3, 2),
        "stream_pieces_per_answer": round(statistics.mean(pieces), 1),
        "stream_requests": len(first),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="untrained model, 3 pairs of 64 episodes")
    args = ap.parse_args()
    tok = ByteTokenizer()
    model = Transformer(MODEL, rngs=nnx.Rngs(0))
    t0 = time.perf_counter()
    sft_steps = 0 if args.quick else 120
    if sft_steps:
        model = warm_start(model, tok, sft_steps)
    sft_s = time.perf_counter() - t0
    engine = Engine(model, ENGINE, eos_token_ids=tok.eos_token_ids, tokenizer=tok)
    tasks = calculator_tasks(4096, seed=7)
    try:
        episodes, pairs = (64, 3) if args.quick else (256, 5)
        out = asyncio.run(measure(engine, tok, tasks, episodes, pairs))
    finally:
        engine.shutdown()
    # the same shapes (kernels already compiled), no eos: every answer is STREAM_TOKENS long
    engine = Engine(model, ENGINE, eos_token_ids=(), tokenizer=tok)
    try:
        out.update(asyncio.run(measure_stream(engine, tok, tasks, 16 if args.quick else 64)))
    finally:
        engine.shutdown()
    out.update(episodes_per_mode=episodes, pairs=pairs, concurrency=CONCURRENCY,
               sft_steps=sft_steps, sft_s=round(sft_s, 1), load=os.getloadavg()[0])
    if not args.quick:
        os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
        with open(os.path.join(os.path.dirname(__file__), "results", "openai_endpoint.json"), "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
