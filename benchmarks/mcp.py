"""An MCP server's tool vs the same tool in process: call latency, and episode throughput.

Workload: the mcp_tools recipe's task ("Code of ab37?", one tool `code(key)`, at most 3 model
calls an episode) on the demo's model (~0.3M parameters, byte vocabulary), warm-started with a
short SFT on the recipe's tool-using demonstrations so that episodes call the tool, then one
real `Engine` (32 slots) shared by both modes, the same `Collector` limits, sampling
(temperature 1, <= 64 tokens a call) and agent (the recipe's, its tool listed from the server).
32 episodes run concurrently. MCP: the recipe's environment, calling the recipe's server
(`python -m agentax.recipes._mcp_server`, a stdio subprocess, one shared connection). Native:
a `ToolEnvironment` with the same function as an in-process `Tool` (a plain sync function, run
on the tool thread pool like every native tool). The modes alternate in pairs (order flipped
each pair) after a warm-up that compiles every kernel and starts the server; figures are
medians over the pairs.

Figures (last line, JSON):
  mcp_call_ms_p50          a trivial tool's call through `MCPConnection.call` (stdio, one call
                           at a time, after warm-up), median in ms; `_p99` too
  native_call_ms_p50       the same function as a native `Tool.call`, median in ms
  mcp_over_native_tool     trajectories/s of the MCP environment over the native one
                           (goal >= 0.7)
  mcp_traj_per_s, native_traj_per_s, tool_calls_per_episode_mcp / _native,
  cpu_ms_per_traj_mcp / _native   process CPU time (all threads) per trajectory: the
                           server's own CPU (another process) is not in it
  server_starts, server_restarts  of the shared connection over the whole run (1 and 0)

Usage: python benchmarks/mcp.py [--quick]   (--quick: < 60 s on 2 cores; the full run writes
results/mcp.json)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

# This file is benchmarks/mcp.py: its folder, first on sys.path when it runs as a script, would
# shadow the `mcp` SDK itself.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from agentax.engine import Engine, EngineConfig  # noqa: E402
from agentax.envs import ToolEnvironment  # noqa: E402
from agentax.models import ModelConfig, Transformer  # noqa: E402
from agentax.recipes import mcp_tools as recipe  # noqa: E402
from agentax.recipes._mcp_server import secret_code  # noqa: E402
from agentax.records import SamplingParams  # noqa: E402
from agentax.rollout import Collector, CollectorConfig  # noqa: E402
from agentax.text import ByteTokenizer, render_conversation  # noqa: E402
from agentax.tools import mcp_connection, mcp_server_specs, tool  # noqa: E402
from agentax.train import SFTTrainer, TrainerConfig  # noqa: E402

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4,
                         num_kv_heads=2, head_dim=32)
ENGINE = EngineConfig(max_slots=32, max_seq_len=160, prefill_chunk=64, min_prefill_bucket=32,
                      decode_steps_per_call=8, precompile=True)
SAMPLING = SamplingParams(temperature=1.0, max_tokens=64)
LIMITS = CollectorConfig(max_turns=3, max_episode_tokens=128, model_timeout_s=120,
                         episode_timeout_s=300)
CONCURRENCY = 32
SPEC = mcp_server_specs(recipe.SERVERS)[0]


@tool(name="code")
def native_code(key: str) -> str:
    """Looks up the code of a key."""
    return secret_code(key.strip())


def warm_start(model, tok, steps: int, seed: int = 0):
    """SFT on the recipe's tool-using demonstrations (the call, the result, the copy)."""
    train, _ = recipe.tasks(num_train=4000, num_eval=0, seed=seed + 100)
    convs = [c for c in recipe.demos(train, 4000, seed) if len(c) == 4]
    examples = [(r.token_ids, r.assistant_mask) for r in
                (render_conversation(tok, c) for c in convs)]
    trainer = SFTTrainer(model, TrainerConfig(learning_rate=3e-3, warmup_steps=10,
                                              micro_batch_size=16, max_seq_len=128,
                                              min_seq_bucket=128, agg_mode="token-mean",
                                              off_policy="none"))
    for i in range(steps):
        trainer.step([examples[(i * 16 + j) % len(examples)] for j in range(16)])
    return trainer.export_model()


async def call_latency(n: int) -> dict:
    """Sequential calls of the server's trivial tool and of the native one."""
    conn = mcp_connection(SPEC)
    for _ in range(20):  # warm-up: the server started, its code paths hot
        await conn.call("code", {"key": "ab37"})
        await native_code.call({"key": "ab37"})
    mcp_ms, native_ms = [], []
    for i in range(n):
        key = f"a{chr(97 + i % 26)}{i % 100:02d}"
        for name in (("mcp", "native") if i % 2 == 0 else ("native", "mcp")):
            t = time.perf_counter()
            result = (await conn.call("code", {"key": key}) if name == "mcp"
                      else await native_code.call({"key": key}))
            (mcp_ms if name == "mcp" else native_ms).append((time.perf_counter() - t) * 1e3)
            assert result.ok and result.content == secret_code(key), result
    return {"mcp_call_ms_p50": round(float(np.percentile(mcp_ms, 50)), 3),
            "mcp_call_ms_p99": round(float(np.percentile(mcp_ms, 99)), 3),
            "native_call_ms_p50": round(float(np.percentile(native_ms, 50)), 3),
            "calls_timed": n}


async def run_mode(collector, tasks, n: int, offset: int):
    queue = list(range(n))
    out = []

    async def worker():
        while queue:
            i = queue.pop()
            out.append(await collector.run_episode(tasks[(offset + i) % len(tasks)],
                                                   seed=offset + i))

    t, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return out, time.perf_counter() - t, time.process_time() - cpu


def _tool_calls(trajs) -> float:
    return sum(sum(len(turn.observation.tool_results) if turn.observation else 0
                   for turn in t.turns) for t in trajs) / len(trajs)


async def measure(engine, tok, tasks, episodes: int, pairs: int, calls: int) -> dict:
    out = await call_latency(calls)
    modes = {
        "mcp": Collector(engine, tok, lambda: recipe.make_env(max_steps=3), recipe.make_agent,
                         SAMPLING, LIMITS),
        "native": Collector(engine, tok, lambda: ToolEnvironment([native_code], recipe.code_reward,
                                                                 max_steps=3),
                            recipe.make_agent, SAMPLING, LIMITS),
    }
    for i, col in enumerate(modes.values()):  # warm-up: every kernel compiled
        await run_mode(col, tasks, 2 * CONCURRENCY, 10_000 * (i + 1))
    ratios: list[float] = []
    rates: dict[str, list[float]] = {k: [] for k in modes}
    cpu_ms: dict[str, list[float]] = {k: [] for k in modes}
    tool_calls: dict[str, list[float]] = {k: [] for k in modes}
    success: dict[str, list[float]] = {k: [] for k in modes}
    statuses: dict[str, int] = {}
    for p in range(pairs):
        order = list(modes) if p % 2 == 0 else list(reversed(modes))
        got = {}
        for name in order:
            trajs, wall, cpu = await run_mode(modes[name], tasks, episodes, p * episodes)
            got[name] = len(trajs) / wall
            cpu_ms[name].append(cpu * 1e3 / len(trajs))
            tool_calls[name].append(_tool_calls(trajs))
            success[name].append(sum(t.reward > 0 for t in trajs) / len(trajs))
            for t in trajs:
                key = f"{name}:{t.status.value}"
                statuses[key] = statuses.get(key, 0) + 1
        for k, v in got.items():
            rates[k].append(v)
        ratios.append(got["mcp"] / got["native"])
    stats = mcp_connection(SPEC).stats
    out.update({
        "mcp_over_native_tool": round(statistics.median(ratios), 3),
        "mcp_traj_per_s": round(statistics.median(rates["mcp"]), 2),
        "native_traj_per_s": round(statistics.median(rates["native"]), 2),
        "tool_calls_per_episode_mcp": round(statistics.mean(tool_calls["mcp"]), 2),
        "tool_calls_per_episode_native": round(statistics.mean(tool_calls["native"]), 2),
        "success_mcp": round(statistics.mean(success["mcp"]), 3),
        "success_native": round(statistics.mean(success["native"]), 3),
        "cpu_ms_per_traj_mcp": round(statistics.median(cpu_ms["mcp"]), 2),
        "cpu_ms_per_traj_native": round(statistics.median(cpu_ms["native"]), 2),
        "pair_ratios": [round(r, 3) for r in ratios],
        "server_starts": stats["starts"], "server_restarts": stats["restarts"],
        "statuses": statuses,
    })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 pairs of 128 episodes (< 60 s)")
    args = ap.parse_args()
    started = time.perf_counter()
    tok = ByteTokenizer()
    sft_steps = 40 if args.quick else 300
    model = warm_start(Transformer(MODEL, rngs=nnx.Rngs(0)), tok, sft_steps)
    sft_s = time.perf_counter() - started
    print(f"warm start: {sft_steps} SFT steps in {sft_s:.1f} s", file=sys.stderr)
    engine = Engine(model, ENGINE, eos_token_ids=tok.eos_token_ids, tokenizer=tok)
    _, tasks = recipe.tasks(num_train=0, num_eval=4096, seed=7)
    episodes, pairs, calls = (128, 5, 300) if args.quick else (256, 9, 2000)
    try:
        out = asyncio.run(measure(engine, tok, tasks, episodes, pairs, calls))
    finally:
        engine.shutdown()
    out.update(episodes_per_mode=episodes, pairs=pairs, concurrency=CONCURRENCY,
               sft_steps=sft_steps, sft_s=round(sft_s, 1),
               wall_s=round(time.perf_counter() - started, 1), load_avg_1m=os.getloadavg()[0])
    if not args.quick:
        os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
        with open(os.path.join(os.path.dirname(__file__), "results", "mcp.json"), "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
