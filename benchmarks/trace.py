"""Tracing cost: on vs off overhead, bytes per episode, and writer cost growth over a long run.

Workload: the synthetic asyncio RL pipeline of `agentax.trace._synthetic` (episodes of model
calls, env steps, tool calls and rewards on per-episode tracks; engine counters; a trainer
with flows from episodes to train steps) on a virtual-time event loop, so every (virtual)
sleep is free and the run is pure Python scheduling work. This is the worst case for tracing
overhead: in a real run the same spans wrap milliseconds of model/env time.

Figures (medians over runs that alternate off/on in one process):
  tracing_overhead        (time with tracing + background writer) / (time with tracing off) - 1
  tracing_overhead_cpu    the same ratio of CPU time (all threads, and the encoder process)
  tracing_overhead_pipeline  the same wall-time ratio for a real tiny Pipeline run (tiny byte
                          model, real engine/trainer/collector, as in tests/pipeline), compile
                          excluded; `--no-pipeline` skips it
  trace_bytes_per_episode bytes of Perfetto trace per episode
  writer_us_per_episode   writer CPU per episode of a long run: the flushing thread's and the
                          encoder process's (its start-up excluded: writer_startup_cpu_s)
  writer_cost_growth      writer time for the last 10% of a long run / for the first 10%
                          (1.0 = incremental: writing does not get slower as the file grows)

Usage: python benchmarks/trace.py [--quick] [--no-pipeline] [--writer process|thread]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import statistics
import tempfile
import time

from agentax.trace import Tracer, names
from agentax.trace._synthetic import SyntheticRun, run_workload, virtual_time_loop

WRITER = "process"  # Tracer.start(writer=...); --writer


def _cpu_s() -> float:
    """CPU time of this process and of its finished children (the trace encoder process is
    reaped by `Tracer.close`, so its CPU counts in the run that started it)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _run_once(cfg: SyntheticRun, enabled: bool, out_dir: str,
              virtual: bool = False) -> tuple[float, int, float]:
    if virtual:
        loop, clock = virtual_time_loop()
        tracer = Tracer(clock=lambda: int(clock[0] * 1e9), enabled=enabled)
    else:
        loop, tracer = asyncio.new_event_loop(), Tracer(enabled=enabled)
    path = tracer.start(out_dir, writer=WRITER) if enabled else None
    start, cpu = time.perf_counter(), _cpu_s()
    try:
        loop.run_until_complete(run_workload(cfg, tracer))
        tracer.close()
    finally:
        loop.close()
    elapsed, cpu = time.perf_counter() - start, _cpu_s() - cpu
    return elapsed, os.path.getsize(path) if path else 0, cpu


def overhead(cfg: SyntheticRun, repeats: int, *, virtual: bool, key: str) -> dict:
    on, off, cpu_on, cpu_off, size = [], [], [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):  # alternate (order flipped each pair) so noise hits both alike
            for enabled in ((False, True) if r % 2 == 0 else (True, False)):
                elapsed, nbytes, cpu = _run_once(cfg, enabled, os.path.join(tmp, f"run{r}"),
                                                 virtual)
                (on if enabled else off).append(elapsed)
                (cpu_on if enabled else cpu_off).append(cpu)
                size = nbytes or size
    episodes = cfg.train_steps * cfg.groups_per_step * cfg.group_size
    t_on, t_off = statistics.median(on), statistics.median(off)
    c_on, c_off = statistics.median(cpu_on), statistics.median(cpu_off)
    # Per-pair ratios too: each pair ran back to back, so their median is the least noisy.
    pairs = statistics.median(a / b - 1.0 for a, b in zip(on, off))
    return {key: round(t_on / t_off - 1.0, 4), f"{key}_paired": round(pairs, 4),
            f"{key}_cpu": round(c_on / c_off - 1.0, 4),
            "trace_bytes_per_episode": round(size / episodes, 1),
            f"{key}_run_s_on": round(t_on, 4), f"{key}_run_s_off": round(t_off, 4),
            f"{key}_repeats": repeats}


def span_cost_ns(n: int, repeats: int = 7) -> dict:
    """Hot-path cost of one span (enter + exit + buffer append), tracing on and off, in thread
    CPU time (robust on a shared machine); median of `repeats` alternated runs. Also the cost
    with args and a custom track, and of a counter sample."""
    def plain(tracer):
        for _ in range(n):
            with tracer.span(names.ENV_STEP):
                pass

    def with_args(tracer):
        for i in range(n):
            with tracer.span(names.ENV_STEP, track="episode/1", args={"turn": i}):
                pass

    def counter(tracer):
        for i in range(n):
            tracer.counter(names.ENGINE_ACTIVE_SLOTS, i)

    samples: dict[str, list] = {}
    for _ in range(repeats):
        for label, fn, enabled in (("on", plain, True), ("off", plain, False),
                                   ("on_args_track", with_args, True),
                                   ("counter", counter, True)):
            tracer = Tracer(enabled=enabled, capacity=n + 1)
            start = time.thread_time_ns()
            fn(tracer)
            samples.setdefault(label, []).append((time.thread_time_ns() - start) / n)
    return {f"span_cost_ns_{k}" if k != "counter" else "counter_cost_ns":
            round(statistics.median(v), 1) for k, v in samples.items()}


def writer_growth(episodes: int, chunks: int = 20) -> dict:
    """Record a long run chunk by chunk and time the writer's drain of each chunk."""
    now = [10**9]
    tracer = Tracer(clock=lambda: now[0], capacity=1 << 22)
    costs = []
    with tempfile.TemporaryDirectory() as tmp:
        tracer.start(tmp, flush_interval_s=3600, writer=WRITER)
        with tracer.span(names.EPISODE):  # start the encoder process (imports) before timing
            now[0] += 1
        tracer.flush()
        startup_ns = encoder_ns = tracer.stats()["encoder_cpu_ns"]
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
            start = time.thread_time()  # CPU time, not wall: robust to busy machines
            tracer.flush()
            thread_s, total_ns = time.thread_time() - start, tracer.stats()["encoder_cpu_ns"]
            costs.append(thread_s + (total_ns - encoder_ns) / 1e9)
            encoder_ns = total_ns
        tracer.close()
    tenth = max(1, chunks // 10)
    first, last = sum(costs[:tenth]), sum(costs[-tenth:])
    return {"writer_cost_growth": round(last / first, 3),
            "writer_us_per_episode": round(1e6 * sum(costs) / (per_chunk * chunks), 2),
            "writer_episodes": per_chunk * chunks,
            "writer_startup_cpu_s": round(startup_ns / 1e9, 3)}


def pipeline_overhead(steps: int, repeats: int) -> dict:
    """A real tiny Pipeline (as in tests/pipeline) run with tracing on and off, alternated."""
    from flax import nnx

    from agentax.agents import ModelAgent
    from agentax.engine import Engine, EngineConfig
    from agentax.envs import TaskEnvironment
    from agentax.models import ModelConfig, Transformer
    from agentax.pipeline import Pipeline, PipelineConfig
    from agentax.records import SamplingParams, Task
    from agentax.rollout import Collector, CollectorConfig
    from agentax.text import ByteTokenizer
    from agentax.trace import get_tracer, set_enabled
    from agentax.train import RLTrainer, TrainerConfig

    model_cfg = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128,
                                 num_heads=2, num_kv_heads=1, head_dim=32)
    tasks = [Task(id=f"t{i}", prompt=f"Say {w}.") for i, w in
             enumerate(["hi", "yes", "abc", "ok", "no", "hey"])]

    def reward(task, response):
        return sum(c in "aeiou" for c in response) / max(len(response), 1)

    tok = ByteTokenizer()
    model = Transformer(model_cfg, rngs=nnx.Rngs(0))
    engine = Engine(model, EngineConfig(max_slots=8, max_seq_len=128, prefill_chunk=64,
                                        decode_steps_per_call=2),
                    eos_token_ids=tok.eos_token_ids, tokenizer=tok)
    trainer = RLTrainer(model, TrainerConfig(learning_rate=3e-3, micro_batch_size=8,
                                             max_seq_len=128, min_seq_bucket=64,
                                             off_policy="tis", is_cap=2.0))
    collector = Collector(engine, tok, lambda: TaskEnvironment(reward),
                          lambda: ModelAgent(system_prompt=None),
                          SamplingParams(temperature=1.0, max_tokens=12),
                          CollectorConfig(max_turns=2, max_episode_tokens=120,
                                          model_timeout_s=60, episode_timeout_s=60))
    config = PipelineConfig(group_size=3, groups_per_step=2, max_concurrency=8, filters=(),
                            mode="async", max_staleness=1)
    tracer, was_enabled = get_tracer(), get_tracer().enabled
    on, off = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            set_enabled(False)
            for _ in range(2):  # warm-up: compile every kernel and sequence bucket
                Pipeline(collector, trainer, engine, tasks, config).run(steps)
            for r in range(repeats):
                for enabled in ((False, True) if r % 2 == 0 else (True, False)):
                    set_enabled(enabled)
                    if enabled:
                        tracer.start(os.path.join(tmp, f"run{r}"), writer=WRITER)
                    start = time.perf_counter()
                    Pipeline(collector, trainer, engine, tasks, config).run(steps)
                    if enabled:
                        tracer.close()
                    (on if enabled else off).append(time.perf_counter() - start)
    finally:
        set_enabled(was_enabled)
        engine.shutdown()
    t_on, t_off = statistics.median(on), statistics.median(off)
    return {"tracing_overhead_pipeline": round(t_on / t_off - 1.0, 4),
            "tracing_overhead_pipeline_paired": round(
                statistics.median(a / b - 1.0 for a, b in zip(on, off)), 4),
            "tracing_overhead_pipeline_run_s_on": round(t_on, 4),
            "tracing_overhead_pipeline_run_s_off": round(t_off, 4),
            "tracing_overhead_pipeline_repeats": repeats,
            "tracing_overhead_pipeline_steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run (< 1 min on 2 cores)")
    parser.add_argument("--no-pipeline", action="store_true",
                        help="skip the real tiny pipeline variant (needs JAX, compiles)")
    parser.add_argument("--writer", choices=("process", "thread"), default="process",
                        help="where the trace is encoded (Tracer.start(writer=...))")
    args = parser.parse_args()
    global WRITER
    WRITER = args.writer
    steps, repeats, episodes = (30, 4, 2_000) if args.quick else (200, 9, 40_000)
    # Real time, a fast environment: 4 ms model calls and env steps, 10 ms train steps.
    real = SyntheticRun(train_steps=steps, max_concurrency=16, max_slots=16, max_staleness=2,
                        model_s=0.004, env_s=0.004, env_sigma=0.3, tool_s=0.001,
                        reward_s=0.001, train_s=0.01, publish_s=0.001)
    result = overhead(real, repeats, virtual=False, key="tracing_overhead")
    # Virtual time: zero-cost sleeps, so the run is pure scheduling work (worst case).
    virtual = dataclasses.replace(real, max_concurrency=32)
    worst = overhead(virtual, repeats, virtual=True, key="tracing_overhead_cpu_bound")
    worst.pop("trace_bytes_per_episode")
    worst.pop("tracing_overhead_cpu_bound_repeats")
    result.update(worst)
    result.update(span_cost_ns(20_000 if args.quick else 200_000))
    result.update(writer_growth(episodes=episodes))
    if not args.no_pipeline:
        result.update(pipeline_overhead(steps=2 if args.quick else 4,
                                        repeats=4 if args.quick else 8))
    result["writer"] = WRITER
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
