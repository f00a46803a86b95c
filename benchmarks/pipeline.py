"""Async vs sync pipeline throughput on an environment with long-tailed step latency.

Workload: the tiny byte model (real engine, real trainer, real collector), multi-turn episodes
in an environment whose step latency is lognormal with its median set to one measured model
turn and p99 about ten times that. Both modes train the same number of groups with the same
model, tasks and knobs; they run one after the other in this process, after a warm-up that
compiles every kernel, so compilation is not counted.

Figures (last line, JSON):
  async_over_sync            trajectories/s of async (best of max_staleness 1, 2) over sync
  trainer_idle_sync/_async   fraction of wall time the trainer waited for data
  staleness_mean/_max        over trained groups of the best async run
  stale_dropped_fraction     episodes dropped as stale / episodes started, pooled over the
                             async runs at max_staleness=1: the main workload and the same
                             with 1 group per step (where arrival-order consumption dropped
                             ~11% before the gate scheduled by deadline)
  stale_dropped_fraction_1gps  that second run alone
  async_over_sync_no_latency the same ratio with zero environment latency

Usage: python benchmarks/pipeline.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time

import numpy as np
from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import Environment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig
from agentax.records import Observation, SamplingParams, StepResult, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                         num_kv_heads=1, head_dim=32)
TASKS = [Task(id=f"t{i}", prompt=f"Count to {i}.") for i in range(32)]
P99_Z = 2.326


class LatencyEnv(Environment):
    """Three-step episodes; each step waits a lognormal latency (a tool or a sandbox)."""

    max_steps = 3

    def __init__(self, median_s: float, rng: random.Random):
        super().__init__()
        self.median_s, self.rng = median_s, rng
        self.sigma = math.log(10.0) / P99_Z  # p99 = 10 x median

    async def _reset(self, task):
        return Observation(content=task.prompt)

    async def _step(self, action):
        if self.median_s > 0:
            await asyncio.sleep(self.median_s * math.exp(self.sigma * self.rng.gauss(0, 1)))
        reward = sum(c in "aeiou" for c in action.text) / max(len(action.text), 1)
        return StepResult(observation=Observation(content="More."), reward=reward,
                          done=self.num_steps >= 3)


def build(median_s: float, seed: int, max_slots: int):
    tok = ByteTokenizer()
    model = Transformer(MODEL, rngs=nnx.Rngs(0))
    engine = Engine(model, EngineConfig(max_slots=max_slots, max_seq_len=256, prefill_chunk=64,
                                        decode_steps_per_call=4),
                    eos_token_ids=tok.eos_token_ids, tokenizer=tok)
    trainer = RLTrainer(model, TrainerConfig(learning_rate=1e-3, micro_batch_size=16,
                                             max_seq_len=256, min_seq_bucket=128,
                                             off_policy="tis", is_cap=2.0))
    rng = random.Random(seed)
    collector = Collector(engine, tok, lambda: LatencyEnv(median_s, rng), lambda: ModelAgent(),
                          SamplingParams(temperature=1.0, max_tokens=16),
                          CollectorConfig(max_turns=3, max_episode_tokens=240))
    return engine, trainer, collector


def run_mode(mode: str, staleness: int, steps: int, median_s: float, args) -> dict:
    engine, trainer, collector = build(median_s, seed=1, max_slots=args.slots)
    cfg = PipelineConfig(mode=mode, max_staleness=staleness, group_size=args.group_size,
                         groups_per_step=args.groups_per_step, max_concurrency=args.slots,
                         filters=())
    try:
        res = Pipeline(collector, trainer, engine, TASKS, cfg).run(steps)
    finally:
        engine.shutdown()
    stale = [s for rec in res.steps for s in rec.staleness]
    acc = res.accounting
    return {"traj_per_s": res.trajectories_per_s, "trainer_idle": res.trainer_idle_fraction,
            "stale_dropped_fraction": acc.filtered.get("stale", 0) / max(acc.started, 1),
            "stale_dropped": acc.filtered.get("stale", 0), "started": acc.started,
            "staleness_mean": float(np.mean(stale)), "staleness_max": int(max(stale)),
            "wall_s": res.wall_s}


def measure_model_turn(args) -> float:
    """Median seconds of one model turn (16 tokens) with a full engine, after warm-up."""
    engine, _, _ = build(0.0, 0, args.slots)
    tok = ByteTokenizer()
    prompt = tok.encode("<|im_start|>user\nCount to 3.<|im_end|>\n<|im_start|>assistant\n")
    params = SamplingParams(temperature=1.0, max_tokens=16)
    try:
        engine.generate_batch([prompt] * args.slots, params)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            engine.generate_batch([prompt] * args.slots, params)
            times.append(time.perf_counter() - t)
    finally:
        engine.shutdown()
    return float(np.median(times))


def compare(median_s: float, args) -> dict:
    sync = run_mode("sync", 0, args.steps, median_s, args)
    asyncs = {s: run_mode("async", s, args.steps, median_s, args) for s in (1, 2)}
    best_s = max(asyncs, key=lambda s: asyncs[s]["traj_per_s"])
    best = asyncs[best_s]
    return {"ratio": best["traj_per_s"] / sync["traj_per_s"], "sync": sync, "async": best,
            "best_staleness": best_s, "async_by_staleness": asyncs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (< 1 minute)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--slots", type=int, default=48)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=4)
    args = ap.parse_args()
    args.steps = args.steps or (3 if args.quick else 24)

    run_mode("async", 1, 2, 0.0, args)  # warm-up: compile every kernel once
    turn_s = measure_model_turn(args)
    with_latency = compare(turn_s, args)
    no_latency = compare(0.0, args)
    one_gps = run_mode("async", 1, args.steps, turn_s, argparse.Namespace(**{**vars(args), "groups_per_step": 1}))
    s1 = with_latency["async_by_staleness"][1]
    stale_fraction = (s1["stale_dropped"] + one_gps["stale_dropped"]) / max(s1["started"] + one_gps["started"], 1)
    figures = {
        "async_over_sync": round(with_latency["ratio"], 3),
        "trainer_idle_sync": round(with_latency["sync"]["trainer_idle"], 3),
        "trainer_idle_async": round(with_latency["async"]["trainer_idle"], 3),
        "staleness_mean": round(with_latency["async"]["staleness_mean"], 3),
        "staleness_max": with_latency["async"]["staleness_max"],
        "stale_dropped_fraction": round(stale_fraction, 4),
        "stale_dropped_fraction_1gps": round(one_gps["stale_dropped_fraction"], 4),
        "async_over_sync_no_latency": round(no_latency["ratio"], 3),
        "best_max_staleness": with_latency["best_staleness"],
        "env_median_latency_s": round(turn_s, 4),
        "sync_traj_per_s": round(with_latency["sync"]["traj_per_s"], 2),
        "async_traj_per_s": round(with_latency["async"]["traj_per_s"], 2),
        "steps": args.steps,
        "workload": (f"tiny byte model, {args.groups_per_step}x{args.group_size} episodes/step, "
                     "3 turns x 16 tokens, lognormal env latency (median = 1 model turn, "
                     f"p99 = 10x), {args.slots} slots"),
    }
    if not args.quick:
        os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
        with open(os.path.join(os.path.dirname(__file__), "results", "pipeline.json"), "w") as f:
            json.dump(figures, f, indent=2)
    sys.stdout.flush()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
