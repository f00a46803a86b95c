"""Tracing cost on a real pipeline (the goal), on a span-dense synthetic one, and whether the
doctor's advice helps.

Goal figure (both full and --quick):
  tracing_overhead_pipeline  (wall time with tracing on) / (off) - 1 on a real tiny pipeline:
                          byte model, real engine, collector and trainer (tests/trace/
                          tiny_pipeline.py), 2-turn episodes of 24 generated tokens and a 20 ms
                          environment step, 8 episodes per optimizer step, 3 steps per run
                          (~0.3 s). After an untraced and a traced warm-up run, runs alternate
                          off/on in one process (order flipped each pair; the warm heap frozen
                          out of the GC's full collections). As in `agentax train`, whose RL
                          phase runs into a trace file opened before it, one file is opened
                          before the pairs and closed after them; a traced run records into
                          it and is timed up to the end of a flush on its own thread (it pays
                          for encoding every event it recorded). The figure is the
                          median of the per-pair ratios, `_ci95` its bootstrap 95% interval.
                          Pairs are added until that interval is narrower than +-0.004 or the
                          time budget is spent (300 s; in --quick, which measures it last,
                          until QUICK_S = 50 s after the start: ~80 pairs, a wider interval).
                          Goal <= 0.01.
  tracing_start_close_ms  the one-time cost of opening and closing that file (a real run
                          pays it once; a 0.3 s run per pair would pay ~0.3 % of its time)
  tracing_overhead_pipeline_cpu  the same ratio of this process's CPU time (all threads)
  tracing_cpu_share_pipeline  CPU the tracing took in those runs over their wall time: events
                          x the measured cost of recording one + the writer thread's CPU time
                          (measured). Not the goal, but not swamped by other jobs' load.
Reported, no goal (the span-dense synthetic asyncio pipeline of tests/trace/synthetic_run.py:
4 ms model calls and env steps, so far more spans per second than a real run):
  tracing_overhead        the same ratio, real time; `_cpu_bound` on a virtual clock
  span_cost_ns_*          hot-path cost of one span / counter sample (thread CPU time)
  trace_bytes_per_episode, writer_us_per_episode (writer thread CPU per episode of a long run),
  writer_cost_growth      writer time for the last 10% of a long run / the first 10% (1 = appends)
Full run only:
  doctor_advice           per injected-bottleneck workload of tiny_pipeline: the doctor's
                          verdict, the knob it suggests, and trajectories/s after following it
                          over before (2 alternated pairs each)

Usage: python benchmarks/trace.py [--quick] [--no-pipeline]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import statistics
import tempfile
import time

import random
import re
import sys

from agentax.trace import Tracer, names

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "trace"))
from synthetic_run import SyntheticRun, run_workload, virtual_time_loop  # noqa: E402


def _cpu_s() -> float:
    return time.process_time()


def _run_once(cfg: SyntheticRun, enabled: bool, out_dir: str,
              virtual: bool = False) -> tuple[float, int, float]:
    if virtual:
        loop, clock = virtual_time_loop()
        tracer = Tracer(clock=lambda: int(clock[0] * 1e9), enabled=enabled)
    else:
        loop, tracer = asyncio.new_event_loop(), Tracer(enabled=enabled)
    path = tracer.start(out_dir) if enabled else None
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
    """Record a long run chunk by chunk and time the writer's drains of each chunk."""
    now = [10**9]
    tracer = Tracer(clock=lambda: now[0], capacity=1 << 22)
    costs = []
    with tempfile.TemporaryDirectory() as tmp:
        tracer.start(tmp, flush_interval_s=3600)
        tracer.flush()
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
            # The writer's CPU time (its thread's, and this flush's): robust to busy machines,
            # and counts the drains the writer started itself once DRAIN_AT events waited.
            start = tracer.stats()["writer_cpu_ns"]
            tracer.flush()
            costs.append((tracer.stats()["writer_cpu_ns"] - start) / 1e9)
        tracer.close()
    tenth = max(1, chunks // 10)
    first, last = sum(costs[:tenth]), sum(costs[-tenth:])
    return {"writer_cost_growth": round(last / first, 3),
            "writer_us_per_episode": round(1e6 * sum(costs) / (per_chunk * chunks), 2),
            "writer_episodes": per_chunk * chunks}


def _median_ci(ratios: list[float], rounds: int = 2000) -> tuple[float, float, float]:
    """Median of `ratios` and a bootstrap 95% interval of it (fixed seed: reproducible)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return statistics.median(ratios), meds[int(0.025 * rounds)], meds[int(0.975 * rounds) - 1]


OVERHEAD_WORK = dict(turns=2, env_step_s=0.02, max_tokens=24, max_concurrency=8,
                     group_size=4, groups_per_step=2)


def pipeline_overhead(tiny, steps: int, budget_s: float, min_pairs: int = 6,
                      target_half_width: float = 0.004) -> dict:
    """Tracing on vs off on the real tiny pipeline, alternated pairs until the 95% interval
    of the median ratio is narrower than +-`target_half_width` or `budget_s` is spent.

    As in `agentax train`, whose RL phase runs into a trace file opened before it, the file
    is opened once, before the pairs, and closed after them; an "on" run records into it and
    ends with a flush on the run's own thread (timed: the run pays for encoding every event it
    recorded). The one-time start and close are timed apart (`tracing_start_close_ms`)."""
    from tiny_pipeline import Workload

    from agentax.trace import get_tracer, set_enabled

    deadline = time.perf_counter() + budget_s
    work = Workload(**OVERHEAD_WORK)
    tracer, was_enabled = get_tracer(), get_tracer().enabled
    ratios, cpu_ratios, on, off, shares = [], [], [], [], []
    record_ns = span_cost_ns(20_000)["span_cost_ns_on_args_track"]  # median of 7: one read 7 us
    with tempfile.TemporaryDirectory() as tmp:
        tracer.take_events()  # what earlier code recorded is not this file's
        started = time.perf_counter()
        tracer.start(tmp)
        start_s, close_s = time.perf_counter() - started, 0.0
        try:
            for enabled in (False, True):  # warm-up: shapes compiled, the writer's protos loaded
                set_enabled(enabled)
                tiny.run(work, steps)
            # The warm heap (JAX, the model, ~200k objects) is left out of later collections:
            # a full collection of it (~0.1-1 s) would land in one run or the other at random.
            gc.collect()
            gc.freeze()
            while True:
                pair, cpu = {}, {}
                for enabled in ((False, True) if len(ratios) % 2 == 0 else (True, False)):
                    set_enabled(enabled)
                    before = tracer.stats()
                    tiny.run(work, steps)  # times the run and its flush, not the setup
                    pair[enabled], cpu[enabled] = tiny.last_run_s, tiny.last_cpu_s
                    if enabled:  # CPU the tracing took: recording (estimated) and writing
                        stats = tracer.stats()
                        shares.append(((stats["written"] - before["written"]) * record_ns
                                       + stats["writer_cpu_ns"] - before["writer_cpu_ns"])
                                      / 1e9 / pair[True])
                on.append(pair[True])
                off.append(pair[False])
                ratios.append(pair[True] / pair[False] - 1.0)
                cpu_ratios.append(cpu[True] / cpu[False] - 1.0)
                if len(ratios) >= min_pairs:
                    med, lo, hi = _median_ci(ratios)
                    if (hi - lo) / 2 < target_half_width or time.perf_counter() > deadline:
                        break
        finally:
            gc.unfreeze()
            set_enabled(was_enabled)
            started = time.perf_counter()
            tracer.close()
            close_s = time.perf_counter() - started
    return {"tracing_overhead_pipeline": round(med, 4),
            "tracing_overhead_pipeline_ci95": [round(lo, 4), round(hi, 4)],
            "tracing_overhead_pipeline_pairs": len(ratios),
            "tracing_overhead_pipeline_run_s_off": round(statistics.median(off), 3),
            "tracing_overhead_pipeline_run_s_on": round(statistics.median(on), 3),
            "tracing_overhead_pipeline_steps": steps,
            "tracing_start_close_ms": round(1e3 * (start_s + close_s), 3),
            "tracing_cpu_share_pipeline": round(statistics.median(shares), 4),
            "tracing_overhead_pipeline_cpu": round(_median_ci(cpu_ratios)[0], 4),
            "tracing_overhead_pipeline_cpu_ci95": [round(x, 4) for x in _median_ci(cpu_ratios)[1:]],
            "tracing_overhead_pipeline_workload": OVERHEAD_WORK}


_KNOB = re.compile(r"raise pipeline\.(\w+) from (\d+) to (?:about )?(\d+)")


def doctor_advice(tiny, steps: int = 4, pairs: int = 2) -> dict:
    """For each injected bottleneck: the doctor's verdict on a traced run, then trajectories/s
    with the knob it suggests over without (alternated pairs, medians)."""
    from tiny_pipeline import WORKLOADS

    from agentax.trace import doctor

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, work in WORKLOADS.items():
            tiny.run(work, 1)  # compile this workload's shapes
            tiny.run(work, steps, os.path.join(tmp, name))
            report = doctor.analyze(os.path.join(tmp, name))
            row = {"bottleneck": report.bottleneck, "suggestion": report.suggestion}
            match = _KNOB.search(report.suggestion)
            if match:
                knob, new = match.group(1), int(match.group(3))
                changed = dataclasses.replace(work, **{knob: new})
                tiny.run(changed, 1)
                rates: dict[bool, list] = {False: [], True: []}
                for p in range(pairs):
                    for follow in ((False, True) if p % 2 == 0 else (True, False)):
                        res = tiny.run(changed if follow else work, steps)
                        rates[follow].append(res.trajectories_trained / res.wall_s)
                row.update(knob=f"{knob} {getattr(work, knob)} -> {new}", followed_over_not=round(
                    statistics.median(rates[True]) / statistics.median(rates[False]), 3))
            out[name] = row
    return out


QUICK_S = 50  # --quick: the pipeline figure's pairs run until this long after the start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run (< 1 min on 2 cores)")
    parser.add_argument("--no-pipeline", action="store_true",
                        help="skip the real tiny pipeline (needs JAX, compiles)")
    args = parser.parse_args()
    started = time.perf_counter()
    steps, repeats, episodes = (20, 3, 2_000) if args.quick else (200, 9, 40_000)
    result = {}
    # Real time, a fast environment: 4 ms model calls and env steps, 10 ms train steps.
    real = SyntheticRun(train_steps=steps, max_concurrency=16, max_slots=16, max_staleness=2,
                        model_s=0.004, env_s=0.004, env_sigma=0.3, tool_s=0.001,
                        reward_s=0.001, train_s=0.01, publish_s=0.001)
    result.update(overhead(real, repeats, virtual=False, key="tracing_overhead"))
    # Virtual time: zero-cost sleeps, so the run is pure scheduling work (worst case).
    virtual = dataclasses.replace(real, max_concurrency=32)
    worst = overhead(virtual, repeats, virtual=True, key="tracing_overhead_cpu_bound")
    worst.pop("trace_bytes_per_episode")
    worst.pop("tracing_overhead_cpu_bound_repeats")
    result.update(worst)
    result.update(span_cost_ns(20_000 if args.quick else 200_000))
    result.update(writer_growth(episodes=episodes))
    if not args.no_pipeline:  # last, so that --quick gives it all the time that is left
        from tiny_pipeline import TinyPipeline

        tiny = TinyPipeline()
        budget = QUICK_S - (time.perf_counter() - started) if args.quick else 300
        try:
            pipeline = pipeline_overhead(tiny, steps=3, budget_s=budget)
            if not args.quick:
                pipeline["doctor_advice"] = doctor_advice(tiny)
        finally:
            tiny.close()
        result = {**pipeline, **result}  # the goal figure first
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    result["synthetic_workload"] = dataclasses.asdict(real)
    if not args.quick:
        os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
        with open(os.path.join(os.path.dirname(__file__), "results", "trace.json"), "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
