"""Tracing cost: on vs off overhead, bytes per episode, and writer cost growth over a long run.

Workload: the synthetic asyncio RL pipeline of `agentax.trace._synthetic` (episodes of model
calls, env steps, tool calls and rewards on per-episode tracks; engine counters; a trainer
with flows from episodes to train steps) on a virtual-time event loop, so every (virtual)
sleep is free and the run is pure Python scheduling work. This is the worst case for tracing
overhead: in a real run the same spans wrap milliseconds of model/env time.

Figures:
  tracing_overhead        (time with tracing + background writer) / (time with tracing off) - 1
  trace_bytes_per_episode bytes of Perfetto trace per episode
  writer_cost_growth      writer time for the last 10% of a long run / for the first 10%
                          (1.0 = incremental: writing does not get slower as the file grows)

Usage: python benchmarks/trace.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import tempfile
import time

from agentax.trace import Tracer, names
from agentax.trace._synthetic import SyntheticRun, run_workload, virtual_time_loop


def _run_once(cfg: SyntheticRun, enabled: bool, out_dir: str,
              virtual: bool = False) -> tuple[float, int]:
    if virtual:
        loop, clock = virtual_time_loop()
        tracer = Tracer(clock=lambda: int(clock[0] * 1e9), enabled=enabled)
    else:
        loop, tracer = asyncio.new_event_loop(), Tracer(enabled=enabled)
    path = tracer.start(out_dir) if enabled else None
    start = time.perf_counter()
    try:
        loop.run_until_complete(run_workload(cfg, tracer))
        tracer.close()
    finally:
        loop.close()
    elapsed = time.perf_counter() - start
    return elapsed, os.path.getsize(path) if path else 0


def overhead(cfg: SyntheticRun, repeats: int, *, virtual: bool, key: str) -> dict:
    on, off, size = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):  # interleave so machine noise hits both alike
            off.append(_run_once(cfg, False, tmp, virtual)[0])
            elapsed, size = _run_once(cfg, True, os.path.join(tmp, f"on{r}"), virtual)
            on.append(elapsed)
    episodes = cfg.train_steps * cfg.groups_per_step * cfg.group_size
    t_on, t_off = statistics.median(on), statistics.median(off)
    return {key: round(t_on / t_off - 1.0, 4),
            "trace_bytes_per_episode": round(size / episodes, 1),
            f"{key}_run_s_on": round(t_on, 4), f"{key}_run_s_off": round(t_off, 4)}


def span_cost_ns(n: int) -> dict:
    """Hot-path cost of one span (enter + exit + buffer append), tracing on and off."""
    out = {}
    for enabled in (True, False):
        tracer = Tracer(enabled=enabled, capacity=n + 1)
        start = time.perf_counter_ns()
        for _ in range(n):
            with tracer.span(names.ENV_STEP):
                pass
        out["span_cost_ns_" + ("on" if enabled else "off")] = round(
            (time.perf_counter_ns() - start) / n, 1)
    return out


def writer_growth(episodes: int, chunks: int = 20) -> dict:
    """Record a long run chunk by chunk and time the writer's drain of each chunk."""
    now = [10**9]
    tracer = Tracer(clock=lambda: now[0], capacity=1 << 22)
    costs = []
    with tempfile.TemporaryDirectory() as tmp:
        tracer.start(tmp, flush_interval_s=3600)
        per_chunk = episodes // chunks
        flow_ids = []
        for chunk in range(chunks):
            for i in range(per_chunk):
                eid = chunk * per_chunk + i
                fid = tracer.new_flow_id()
                flow_ids.append(fid)
                with tracer.span(names.EPISODE, track=names.episode_track(eid), flow_out=(fid,),
                                 args={names.ARG_EPISODE_ID: eid}):
                    for turn in range(3):
                        with tracer.span(names.MODEL_CALL):
                            now[0] += 200_000
                        tracer.counter(names.ENGINE_ACTIVE_SLOTS, turn)
                        with tracer.span(names.ENV_STEP, args={"turn": turn}):
                            now[0] += 300_000
                    with tracer.span(names.REWARD):
                        now[0] += 10_000
                if len(flow_ids) == 4:
                    with tracer.span(names.TRAIN_STEP, track=names.TRAINER_TRACK,
                                     flow_in=flow_ids):
                        now[0] += 500_000
                    flow_ids = []
            start = time.thread_time()  # CPU time of this thread: robust to busy machines
            tracer.flush()
            costs.append(time.thread_time() - start)
        tracer.close()
    tenth = max(1, chunks // 10)
    first, last = sum(costs[:tenth]), sum(costs[-tenth:])
    return {"writer_cost_growth": round(last / first, 3),
            "writer_us_per_episode": round(1e6 * sum(costs) / (per_chunk * chunks), 2),
            "writer_episodes": per_chunk * chunks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run (< 1 min on 2 cores)")
    args = parser.parse_args()
    steps, repeats, episodes = (30, 3, 2_000) if args.quick else (200, 5, 40_000)
    # Real time, a fast environment: 4 ms model calls and env steps, 10 ms train steps.
    real = SyntheticRun(train_steps=steps, max_concurrency=16, max_slots=16, max_staleness=2,
                        model_s=0.004, env_s=0.004, env_sigma=0.3, tool_s=0.001,
                        reward_s=0.001, train_s=0.01, publish_s=0.001)
    result = overhead(real, repeats, virtual=False, key="tracing_overhead")
    # Virtual time: zero-cost sleeps, so the run is pure scheduling work (worst case).
    virtual = dataclasses.replace(real, max_concurrency=32)
    worst = overhead(virtual, repeats, virtual=True, key="tracing_overhead_cpu_bound")
    worst.pop("trace_bytes_per_episode")
    result.update(worst)
    result.update(span_cost_ns(20_000 if args.quick else 200_000))
    result.update(writer_growth(episodes=episodes))
    result["workload"] = ("synthetic asyncio RL pipeline (agentax.trace._synthetic), episodes of "
                          "3 turns (model call, env step, tool call every other turn) + reward, "
                          "engine counters, trainer with flows; real time "
                          f"{dataclasses.asdict(real)}; cpu_bound = same on a virtual clock")
    if not args.quick:
        os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
        with open(os.path.join(os.path.dirname(__file__), "results", "trace.json"), "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
