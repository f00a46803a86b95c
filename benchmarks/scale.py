"""Remote environment workers: episode throughput with 1, 2, 4 Ray actors, and per-step overhead.

Workload: the tiny byte model in a real engine (in this process) and a real collector; the
environments are `agentax.scale.testing.SleepyEnv` in a `RayEnvPool` on a local Ray cluster:
three-step episodes whose steps *block* for a fixed latency set to ten model turns (an
environment-bound workload: a sandbox, a browser, a simulator). The collector keeps more
episodes in flight than there are workers, so the pool size is the bottleneck. The engine is
compiled by warm-up episodes first; the model turn is then measured warm (median of several
turns, never a compiling one), and the environment latency derived from it is capped at
[`MIN_LATENCY_S`, `MAX_LATENCY_S`], so a slow machine makes the run no longer than a fast one by more than that
factor. Every wait is bounded (actor start, each timed run, each episode).

Figures (last line, JSON):
  env_workers_2_over_1 / env_workers_4_over_1   episodes/s with 2 / 4 actors over 1 actor
  remote_env_overhead_ms   per step, a remote environment minus the same one in-process
                           (zero-latency steps, one after another)
  episodes_per_s_1/_2/_4, env_step_latency_s, model_turn_s
The full run repeats the three pool sizes three times, interleaved, and keeps the best rate of
each (the machine is shared; the best run is the least disturbed one).

The environment latency is a blocking sleep, so workers scale past the machine's cores; a
CPU-bound environment would stop scaling at the number of cores Ray may use.

Usage: python benchmarks/scale.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import time

from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import ensure_async_env
from agentax.models import ModelConfig, Transformer
from agentax.records import Action, SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.scale import RayEnvPool
from agentax.scale._ray import require_ray
from agentax.scale.testing import SleepyEnv
from agentax.text import ByteTokenizer

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                         num_kv_heads=1, head_dim=32)
TOKENIZER = ByteTokenizer()
NUM_STEPS = 3
OVERHEAD_EPISODE = 10**9
MIN_LATENCY_S = 0.1  # env step latency floor: long enough that one run is not all noise
MAX_LATENCY_S = 0.25  # env step latency cap: 8 episodes x 3 steps on 1 worker stay ~6 s
RUN_TIMEOUT_S = 120.0  # bound on one timed run (all its episodes)


T0 = time.perf_counter()


def phase(name: str) -> None:
    """Progress on stderr (the last stdout line stays the JSON)."""
    print(f"[{time.perf_counter() - T0:6.1f} s] {name}", file=sys.stderr, flush=True)


def make_collector(engine: Engine, env_factory, max_tokens: int) -> Collector:
    return Collector(
        engine, TOKENIZER, env_factory, lambda: ModelAgent(system_prompt=None),
        SamplingParams(temperature=1.0, max_tokens=max_tokens),
        CollectorConfig(max_turns=NUM_STEPS, max_episode_tokens=256, model_timeout_s=60,
                        episode_timeout_s=RUN_TIMEOUT_S),
    )


async def run_episodes(collector: Collector, n: int, concurrency: int) -> float:
    """Runs n episodes, at most `concurrency` at once; returns episodes per second."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int):
        async with gate:
            traj = await collector.run_episode(Task(id=f"t{i}", prompt=f"Step {i}."), seed=i)
            assert traj.status.value == "ok", (traj.status, traj.info)

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), RUN_TIMEOUT_S)
    return n / (time.perf_counter() - t0)


def measure_model_turn(engine: Engine, max_tokens: int, repeats: int = 5) -> float:
    """Median seconds of one warm model turn (prompt + max_tokens).

    Call after warm-up episodes have compiled every shape; the first call here is discarded too.
    """
    prompt = TOKENIZER.encode("Step 0.")
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    engine.generate_batch([prompt], params)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.generate_batch([prompt], params)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_overhead_ms(pool: RayEnvPool, steps: int) -> float:
    """Per-step time of a remote environment minus the same environment in-process.

    `pool` must serve `SleepyEnv(num_steps=OVERHEAD_EPISODE)` (zero latency, long episodes).
    """

    async def drive(env) -> float:
        await env.reset(Task(id="overhead", prompt="go"))
        action = Action(text="a")
        t0 = time.perf_counter()
        for _ in range(steps):
            await env.step(action)
        elapsed = time.perf_counter() - t0
        await env.close()
        return elapsed

    local = asyncio.run(asyncio.wait_for(drive(ensure_async_env(SleepyEnv(num_steps=OVERHEAD_EPISODE))),
                                         RUN_TIMEOUT_S))
    remote = asyncio.run(asyncio.wait_for(drive(pool.factory()), RUN_TIMEOUT_S))
    return (remote - local) / steps * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (< 1 min on two cores)")
    args = ap.parse_args()
    episodes = 8 if args.quick else 32
    concurrency = 8
    max_tokens = 4
    overhead_steps = 200 if args.quick else 2000
    repeats = 2 if args.quick else 3
    workers = (1, 2, 4)

    ray = require_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    phase("ray up")
    engine = Engine(Transformer(MODEL, rngs=nnx.Rngs(0)),
                    EngineConfig(max_slots=16, max_seq_len=256, prefill_chunk=64, decode_steps_per_call=4),
                    eos_token_ids=TOKENIZER.eos_token_ids, tokenizer=TOKENIZER)
    try:
        # Warm-up: compile every engine shape the episodes use (local, zero-latency envs),
        # then measure a warm turn; the latency comes from it, never from a compiling turn.
        warm_env = functools.partial(SleepyEnv, num_steps=NUM_STEPS, step_latency_s=0.0)
        for _ in range(2):
            asyncio.run(run_episodes(make_collector(engine, warm_env, max_tokens), concurrency, concurrency))
        phase("engine warm")
        turn_s = measure_model_turn(engine, max_tokens)
        latency_s = min(max(10 * turn_s, MIN_LATENCY_S), MAX_LATENCY_S)
        env = functools.partial(SleepyEnv, num_steps=NUM_STEPS, step_latency_s=latency_s)
        pools = {w: RayEnvPool(env, w, num_cpus=0.25, start_timeout_s=60.0, lease_timeout_s=60.0)
                 for w in workers}
        pools[0] = RayEnvPool(functools.partial(SleepyEnv, num_steps=OVERHEAD_EPISODE), 1, num_cpus=0.25,
                              start_timeout_s=60.0)
        try:
            for pool in pools.values():
                pool.warm_up(timeout_s=60.0)
            phase("actors warm")
            rates = dict.fromkeys(workers, 0.0)
            for _ in range(repeats):  # interleaved, best of: the machine is shared
                for w in workers:
                    collector = make_collector(engine, pools[w].factory, max_tokens)
                    rates[w] = max(rates[w], asyncio.run(run_episodes(collector, episodes, concurrency)))
            phase("timed runs done")
            overhead = step_overhead_ms(pools[0], overhead_steps)
        finally:
            for pool in pools.values():
                pool.shutdown()
    finally:
        engine.shutdown()
        ray.shutdown()

    figures = {
        "env_workers_2_over_1": round(rates[2] / rates[1], 3),
        "env_workers_4_over_1": round(rates[4] / rates[1], 3),
        "remote_env_overhead_ms": round(overhead, 3),
        "episodes_per_s_1": round(rates[1], 3),
        "episodes_per_s_2": round(rates[2], 3),
        "episodes_per_s_4": round(rates[4], 3),
        "env_step_latency_s": round(latency_s, 4),
        "env_step_latency_capped": latency_s == MAX_LATENCY_S,
        "model_turn_s": round(turn_s, 4),
        "episodes": episodes,
        "workload": (f"tiny byte model, {NUM_STEPS}-step episodes, blocking env steps of 10 warm "
                     f"model turns (at most {MAX_LATENCY_S} s), {concurrency} episodes in flight, Ray actors of 0.25 CPU on a local "
                     "2-CPU cluster"),
    }
    if not args.quick:
        os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
        with open(os.path.join(os.path.dirname(__file__), "results", "scale.json"), "w") as f:
            json.dump(figures, f, indent=2)
    sys.stdout.flush()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
