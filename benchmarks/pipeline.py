"""Async vs sync pipeline throughput on an environment with long-tailed step latency.

Workload: the tiny byte model (real engine, real trainer, real collector), 3-turn episodes in
an environment whose step latency is lognormal, median 0.1 s and p99 ten times that (a tool
call or a sandbox step: its latency does not shrink when the model gets faster). The k-th
episode of every run gets the same latencies (`EpisodeLatencies`: common random numbers), so
sync and async face the same stragglers (drawn from one shared stream, a 24-step ratio would
swing by +-0.3 with the draw alone). The median is fixed rather than one measured model turn,
so the workload does not shrink with every engine speed-up; the turn-latency workload is
still measured, as `*_turn_latency`. Both
modes train the same number of groups with the same model, tasks and knobs; they run one after
the other in this process, after a warm-up that compiles every kernel, so compilation is not
counted in the ratios. Throughput is counted in steady state: the first FILL_STEPS steps of
every run are left out (async starts max_staleness + 1 steps' worth of groups at once).

Figures (last line, JSON):
  async_over_sync            trajectories/s of async (best of max_staleness 1, 2) over sync
  async_over_sync_max_staleness_1/_2   the same ratio at each bound
  ceiling_max_staleness_1/_2 the most async can gain at that bound given this sync run's
                             rollout time R and train time S per step (see `ceiling`): at
                             max_staleness=1 never more than 2, whatever the workload
  tail_ceiling_max_staleness_1/_2  the same with the long tail kept: the pipeline's schedule
                             (StalenessGate + StragglerLimit) replayed in virtual time on this
                             sync run's own group times (`tail_ceiling`); what async reaches if
                             rollouts and training shared no CPU
  tail_ceiling_never_drop_max_staleness_1/_2  the same replay without straggler drops (the
                             gate alone, without the straggler rule)
  async_over_sync_no_contention_max_staleness_1/_2  (full run only) the real Pipeline
                             driving sleep-only parts with this workload's model turn, env
                             latency and sync train step: the scheduling alone, no CPU shared
  tail_ceiling_no_contention_max_staleness_1/_2  (full run only) `tail_ceiling` of that sleep
                             run's sync arm: the scheduling alone against its own bound
  sync_rollout_s_per_step, sync_train_s_per_step   R and S of the sync run (means)
  async_train_s_per_step_max_staleness_1  S while rollouts share the CPU with training
  trainer_idle_sync/_async   fraction of wall time the trainer waited for data (async: best
                             run; also at max_staleness=1)
  staleness_mean/_max        over trained groups of the best async run
  stale_dropped_fraction     episodes dropped as stale / episodes started, pooled over the
                             async runs at max_staleness=1: the main workload and the same
                             with 1 group per step (where arrival-order consumption dropped
                             ~11% before the gate scheduled by deadline). Now these are the
                             stragglers `StragglerLimit` drops (docs/async.md)
  stale_dropped_fraction_1gps  that second run alone
  stale_dropped_fraction_max_staleness_2  the main workload's run at max_staleness=2
  async_over_sync_turn_latency(_max_staleness_1)  (full run only) the ratio under the old
                             workload
  async_over_sync_no_latency (full run only) the ratio with zero environment latency
  compile_s / warmup_s       seconds XLA spent compiling during the warm-up, and the warm-up's
                             wall time, on a fresh JAX compilation cache (`--cache-dir`)
  compile_s_second_run / warmup_s_second_run  the same warm-up in a second process on the
                             cache the first filled: a second identical run or a resume

Usage: python benchmarks/pipeline.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig, enable_compilation_cache
from agentax.envs import Environment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import (STRAGGLER_FACTOR, Pipeline, PipelineConfig, StalenessGate,
                              StragglerLimit)
from agentax.records import Observation, SamplingParams, StepResult, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig

MODEL = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                         num_kv_heads=1, head_dim=32)
TASKS = [Task(id=f"t{i}", prompt=f"Count to {i}.") for i in range(32)]
P99_Z = 2.326
FILL_STEPS = 3
"""Steps left out of every throughput figure (max_staleness + 1 for the largest bound run)."""
ENV_MEDIAN_S = 0.1
"""Median environment step latency of the main workload (seconds, fixed: a tool call or a
sandbox step does not get faster when the model does)."""


class EpisodeLatencies:
    """The environment latencies of each episode, drawn from its own seeded generator: the
    k-th episode a run starts gets the same three latencies in every mode (common random
    numbers), so the sync and async runs of one comparison face the same stragglers instead of
    two independent draws of a long tail (same distribution: lognormal, p99 = 10 x median)."""

    def __init__(self, median_s: float, seed: int):
        self.median_s, self.seed, self.started = median_s, seed, 0
        self.sigma = math.log(10.0) / P99_Z

    def next_episode(self) -> list[float]:
        """The latencies (seconds) of the next episode's environment steps."""
        rng = random.Random(f"{self.seed}/{self.started}")
        self.started += 1
        return [self.median_s * math.exp(self.sigma * rng.gauss(0, 1))
                for _ in range(LatencyEnv.max_steps)]


class LatencyEnv(Environment):
    """Three-step episodes; each step waits a lognormal latency (a tool or a sandbox)."""

    max_steps = 3

    def __init__(self, latencies: list[float]):
        super().__init__()
        self.latencies = latencies

    async def _reset(self, task):
        return Observation(content=task.prompt)

    async def _step(self, action):
        if self.latencies[self.num_steps - 1] > 0:
            await asyncio.sleep(self.latencies[self.num_steps - 1])
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
    latencies = EpisodeLatencies(median_s, seed)
    collector = Collector(engine, tok, lambda: LatencyEnv(latencies.next_episode()),
                          lambda: ModelAgent(),
                          SamplingParams(temperature=1.0, max_tokens=16),
                          CollectorConfig(max_turns=3, max_episode_tokens=240))
    return engine, trainer, collector


class GroupClock:
    """Each group's rollout time in a sync run: from its step's start (the run's start, then
    each publish) to its last episode's end."""

    def __init__(self):
        self.step_starts = [time.perf_counter()]
        self.group_ends: dict[str, float] = {}

    def on_episode(self, traj) -> None:
        # Called as each member finishes: the last call is the group's last member.
        self.group_ends[traj.group_id] = time.perf_counter()

    def on_step(self, record) -> None:
        self.step_starts.append(time.perf_counter())

    def group_s(self, groups_per_step: int, steps: int) -> list[float]:
        return [self.group_ends[f"g{i}"] - self.step_starts[i // groups_per_step]
                for i in range(steps * groups_per_step)]


def run_mode(mode: str, staleness: int, steps: int, median_s: float, args) -> dict:
    engine, trainer, collector = build(median_s, seed=1, max_slots=args.slots)
    cfg = PipelineConfig(mode=mode, max_staleness=staleness, group_size=args.group_size,
                         groups_per_step=args.groups_per_step, max_concurrency=args.slots,
                         filters=())
    clock = GroupClock()
    try:
        res = Pipeline(collector, trainer, engine, TASKS, cfg, on_episode=clock.on_episode,
                       on_step=clock.on_step).run(steps)
    finally:
        engine.shutdown()
    stale = [s for rec in res.steps for s in rec.staleness]
    acc = res.accounting
    # Steady state: async starts max_staleness + 1 steps' worth of groups at once, which lends
    # its first steps a head start no long run has; every mode skips the same first steps.
    skip = FILL_STEPS if len(res.steps) > FILL_STEPS else 0
    timed = res.steps[skip:]
    start = res.steps[skip - 1].wall_s if skip else 0.0
    period = (timed[-1].wall_s - start) / len(timed)
    train_s = float(np.mean([rec.train_s for rec in timed]))
    trained = sum(len(rec.group_ids) for rec in timed) * args.group_size
    return {"traj_per_s": trained / (timed[-1].wall_s - start),
            "trainer_idle": res.trainer_idle_fraction,
            "train_s": train_s, "rollout_s": period - train_s,
            "stale_dropped_fraction": acc.filtered.get("stale", 0) / max(acc.started, 1),
            "stale_dropped": acc.filtered.get("stale", 0), "started": acc.started,
            "staleness_mean": float(np.mean(stale)), "staleness_max": int(max(stale)),
            "wall_s": res.wall_s, "step_wall_s": [rec.wall_s for rec in res.steps],
            "step_train_s": [rec.train_s for rec in res.steps],
            "group_s": clock.group_s(args.groups_per_step, len(res.steps)) if mode == "sync" else None,
            "more_group_s": (later_group_s(median_s, len(res.steps) * args.groups_per_step,
                                           getattr(args, "turn_s", 0.0), args)
                             if mode == "sync" else None),
            "groups_per_step": args.groups_per_step,
            "max_running_groups": args.slots // args.group_size}


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


class _SleepEngine:
    """Engine stand-in: holds the published version (no compute)."""

    def __init__(self):
        self.version = 0

    def update_weights(self, state, version: int) -> None:
        self.version = version


class _SleepCollector:
    """Collector stand-in: the workload's episodes as sleeps — each turn samples at the
    engine's current version, takes `turn_s`, then an environment step with the latencies
    LatencyEnv would get (the same `EpisodeLatencies`). No CPU is used, so nothing contends
    with the trainer."""

    def __init__(self, engine: _SleepEngine, turn_s: float, latencies: EpisodeLatencies,
                 rng: random.Random):
        self.engine, self.turn_s, self.latencies, self.rng = engine, turn_s, latencies, rng

    async def run_episode(self, task, *, seed, group_id, sample_index):
        from agentax.records import Trajectory, TrajectoryStatus

        versions = []
        for latency in self.latencies.next_episode():
            versions.append(self.engine.version)
            await asyncio.sleep(self.turn_s)
            await asyncio.sleep(latency)
        n = len(versions)
        return Trajectory(task_id=task.id, token_ids=np.zeros(n, np.int32),
                          loss_mask=np.ones(n, np.int8), logprobs=np.zeros(n, np.float32),
                          versions=np.asarray(versions, np.int32), reward=self.rng.random(),
                          status=TrajectoryStatus.OK, group_id=group_id, sample_index=sample_index)


class _SleepTrainer:
    def __init__(self, step_s: float):
        self.step_s = step_s

    def step(self, groups):
        time.sleep(self.step_s)

    def params_for_engine(self):
        return None


def no_contention(turn_s: float, train_s: float, args) -> dict:
    """async over sync of the real Pipeline driving sleep-only parts with the main workload's
    model turn, environment latency and sync train step: the pipeline's own scheduling, with
    no CPU shared between rollouts and training (compare with the ceilings)."""
    out = {}
    for mode, staleness in (("sync", 0), ("async", 1), ("async", 2)):
        engine = _SleepEngine()
        collector = _SleepCollector(engine, turn_s, EpisodeLatencies(args.env_latency_s, 1),
                                    random.Random(1))
        cfg = PipelineConfig(mode=mode, max_staleness=staleness, group_size=args.group_size,
                             groups_per_step=args.groups_per_step, max_concurrency=args.slots,
                             filters=())
        clock = GroupClock()
        res = Pipeline(collector, _SleepTrainer(train_s), engine, TASKS, cfg,
                       on_episode=clock.on_episode, on_step=clock.on_step).run(args.steps)
        timed = res.steps[FILL_STEPS:]
        out[staleness] = len(timed) * args.groups_per_step * args.group_size / (
            timed[-1].wall_s - res.steps[FILL_STEPS - 1].wall_s)
        if mode == "sync":
            sync = {"step_wall_s": [r.wall_s for r in res.steps],
                    "group_s": clock.group_s(args.groups_per_step, len(res.steps)),
                    "more_group_s": later_group_s(args.env_latency_s,
                                                  len(res.steps) * args.groups_per_step, turn_s, args),
                    "groups_per_step": args.groups_per_step,
                    "max_running_groups": args.slots // args.group_size}
    return {"ratio": {s: out[s] / out[0] for s in (1, 2)},
            "tail_ceiling": {s: tail_ceiling(sync, s) for s in (1, 2)}}


def later_group_s(median_s: float, groups: int, turn_s: float, args) -> list[float]:
    """Rollout times of the groups after a sync run's last one, as the async run meets them
    when it starts replacements for dropped stragglers: the next episodes' latencies from the
    same `EpisodeLatencies` stream, plus one model turn (`turn_s`, measured warm) a step."""
    latencies = EpisodeLatencies(median_s, seed=1)
    latencies.started = groups * args.group_size
    return [max(sum(turn_s + x for x in latencies.next_episode()) for _ in range(args.group_size))
            for _ in range(groups)]


def compare(median_s: float, args) -> dict:
    sync = run_mode("sync", 0, args.steps, median_s, args)
    asyncs = {s: run_mode("async", s, args.steps, median_s, args) for s in (1, 2)}
    best_s = max(asyncs, key=lambda s: asyncs[s]["traj_per_s"])
    ratios = {s: a["traj_per_s"] / sync["traj_per_s"] for s, a in asyncs.items()}
    return {"ratio": ratios[best_s], "ratios": ratios, "sync": sync, "async": asyncs[best_s],
            "best_staleness": best_s, "async_by_staleness": asyncs}


class CompileClock:
    """Seconds XLA spent producing executables (compiling, or loading them from JAX's
    persistent cache), and the cache's hits and misses, from `jax.monitoring` events."""

    def __init__(self):
        from jax import monitoring

        self.compile_s, self.hits, self.misses = 0.0, 0, 0
        monitoring.register_event_duration_secs_listener(self._duration)
        monitoring.register_event_listener(self._event)

    def _duration(self, name, secs, **_):
        if name == "/jax/core/compile/backend_compile_duration":
            self.compile_s += secs

    def _event(self, name, **_):
        if name == "/jax/compilation_cache/cache_hits":
            self.hits += 1
        elif name == "/jax/compilation_cache/cache_misses":
            self.misses += 1


def warm_up(args) -> dict:
    """Compiles every kernel once (engine and trainer): a 2-step async run, then the model turn."""
    t = time.perf_counter()
    run_mode("async", 1, 2, 0.0, args)
    turn_s = measure_model_turn(args)
    return {"warmup_s": time.perf_counter() - t, "turn_s": turn_s}


def second_run_compile(cache_dir: str, args) -> dict:
    """The same warm-up in a fresh process on the cache this run filled: what a second
    identical run (or a resume) spends compiling."""
    cmd = [sys.executable, __file__, "--warmup-only", "--cache-dir", cache_dir,
           "--slots", str(args.slots), "--group-size", str(args.group_size),
           "--groups-per-step", str(args.groups_per_step)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"second-run warm-up failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (< 1 minute)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--slots", type=int, default=48)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--env-latency-s", type=float, default=ENV_MEDIAN_S,
                    help="median environment step latency of the main workload")
    ap.add_argument("--cache-dir", default=None,
                    help="JAX compilation cache (default: a fresh temporary directory, so "
                         "compile_s is a cold start and compile_s_second_run a warm one)")
    ap.add_argument("--warmup-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.steps = args.steps or (FILL_STEPS + 3 if args.quick else 24)

    tmp = None
    if args.cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="agentax-pipeline-bench-")
        args.cache_dir = tmp.name
    enable_compilation_cache(args.cache_dir)
    clock = CompileClock()
    warm = warm_up(args)
    compiled = {"compile_s": clock.compile_s, "warmup_s": warm["warmup_s"],
                "cache_hits": clock.hits, "cache_misses": clock.misses}
    if args.warmup_only:
        print(json.dumps(compiled))
        return
    turn_s = args.turn_s = warm["turn_s"]
    main_run = compare(args.env_latency_s, args)
    # Full run only, like the sleep stand-ins below: --quick took 64 s on a slow 2-core day
    # with them (they are 13 s of it), over its one-minute budget.
    turn_run = None if args.quick else compare(turn_s, args)  # latency = one model turn
    no_latency = None if args.quick else compare(0.0, args)
    one_gps = run_mode("async", 1, args.steps, args.env_latency_s,
                       argparse.Namespace(**{**vars(args), "groups_per_step": 1}))
    # Full run only: it takes about as long again as the main workload's three runs.
    sleeping = None if args.quick else no_contention(turn_s, main_run["sync"]["train_s"], args)
    second = second_run_compile(args.cache_dir, args)
    if tmp is not None:
        tmp.cleanup()
    s1 = main_run["async_by_staleness"][1]
    stale_fraction = (s1["stale_dropped"] + one_gps["stale_dropped"]) / max(s1["started"] + one_gps["started"], 1)
    sync = main_run["sync"]
    figures = {
        "async_over_sync": round(main_run["ratio"], 3),
        "async_over_sync_max_staleness_1": round(main_run["ratios"][1], 3),
        "async_over_sync_max_staleness_2": round(main_run["ratios"][2], 3),
        "ceiling_max_staleness_1": round(ceiling(sync, 1), 3),
        "ceiling_max_staleness_2": round(ceiling(sync, 2), 3),
        "tail_ceiling_max_staleness_1": round(tail_ceiling(sync, 1), 3),
        "tail_ceiling_max_staleness_2": round(tail_ceiling(sync, 2), 3),
        "tail_ceiling_never_drop_max_staleness_1": round(tail_ceiling(sync, 1, None), 3),
        "tail_ceiling_never_drop_max_staleness_2": round(tail_ceiling(sync, 2, None), 3),
        "best_max_staleness": main_run["best_staleness"],
        **({} if sleeping is None else {
            "async_over_sync_no_contention_max_staleness_1": round(sleeping["ratio"][1], 3),
            "async_over_sync_no_contention_max_staleness_2": round(sleeping["ratio"][2], 3),
            "tail_ceiling_no_contention_max_staleness_1": round(sleeping["tail_ceiling"][1], 3),
            "tail_ceiling_no_contention_max_staleness_2": round(sleeping["tail_ceiling"][2], 3)}),
        "trainer_idle_sync": round(sync["trainer_idle"], 3),
        "trainer_idle_async": round(main_run["async"]["trainer_idle"], 3),
        "trainer_idle_async_max_staleness_1": round(s1["trainer_idle"], 3),
        "sync_rollout_s_per_step": round(sync["rollout_s"], 4),
        "sync_train_s_per_step": round(sync["train_s"], 4),
        "async_train_s_per_step_max_staleness_1": round(s1["train_s"], 4),
        "staleness_mean": round(main_run["async"]["staleness_mean"], 3),
        "staleness_max": main_run["async"]["staleness_max"],
        "stale_dropped_fraction": round(stale_fraction, 4),
        "stale_dropped_fraction_1gps": round(one_gps["stale_dropped_fraction"], 4),
        "stale_dropped_fraction_max_staleness_2": round(
            main_run["async_by_staleness"][2]["stale_dropped_fraction"], 4),
        **({} if turn_run is None else {
            "async_over_sync_turn_latency": round(turn_run["ratio"], 3),
            "async_over_sync_turn_latency_max_staleness_1": round(turn_run["ratios"][1], 3),
            "async_over_sync_no_latency": round(no_latency["ratio"], 3)}),
        "env_median_latency_s": args.env_latency_s,
        "model_turn_s": round(turn_s, 4),
        "sync_traj_per_s": round(sync["traj_per_s"], 2),
        "async_traj_per_s": round(main_run["async"]["traj_per_s"], 2),
        "compile_s": round(compiled["compile_s"], 2),
        "compile_s_second_run": round(second["compile_s"], 2),
        "warmup_s": round(compiled["warmup_s"], 2),
        "warmup_s_second_run": round(second["warmup_s"], 2),
        "compile_cache_hits_second_run": second["cache_hits"],
        "compile_cache_misses_second_run": second["cache_misses"],
        "steps": args.steps,
        "workload": (f"tiny byte model, {args.groups_per_step}x{args.group_size} episodes/step, "
                     f"3 turns x 16 tokens, lognormal env latency (median {args.env_latency_s:g} s, "
                     f"p99 10x; turn_latency: median = 1 model turn), {args.slots} slots"),
    }
    if not args.quick:
        os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
        with open(os.path.join(os.path.dirname(__file__), "results", "pipeline.json"), "w") as f:
            json.dump(figures, f, indent=2)
    sys.stdout.flush()
    print(json.dumps(figures))


def tail_ceiling(sync: dict, max_staleness: int, straggler_factor: float | None = STRAGGLER_FACTOR) -> float:
    """The most async can gain over this sync run at `max_staleness` if every group took
    exactly as long as it did in the sync run (the same episodes with the same latencies:
    `EpisodeLatencies`) and rollouts and training shared nothing: the pipeline's schedule —
    the real `StalenessGate` and `StragglerLimit` — replayed on the sync run's own group times
    in virtual time (`replay_schedule`), each step costing what the sync step's train + publish
    cost. Unlike `ceiling` this keeps the long tail: a straggler delays its chain in full
    unless the straggler rule drops it. `straggler_factor=None` replays the gate alone (never
    drop), the schedule before stragglers were dropped."""
    walls, group_s, gps = sync["step_wall_s"], sync["group_s"], sync["groups_per_step"]
    slowest = [max(group_s[k * gps:(k + 1) * gps]) for k in range(len(walls))]
    cost = [wall - (walls[k - 1] if k else 0.0) - slowest[k] for k, wall in enumerate(walls)]
    # Replacements for dropped groups need more group times than the sync run had: the next
    # episodes' latencies (`later_group_s`); without them the replay reuses the run's own, and
    # compares only the steps before the first step that trained, or dropped, a reused one.
    more = sync.get("more_group_s") or group_s
    out = replay_schedule(group_s + more, cost, max_staleness, gps,
                          max_running=sync["max_running_groups"], straggler_factor=straggler_factor)
    if sync.get("more_group_s"):
        group_s = group_s + more
    steps = min(len(walls), next((k for k, last in enumerate(out["step_last_group"])
                                  if last >= len(group_s)), len(walls)))
    walls, ends = walls[:steps], out["step_ends"][:steps]
    skip = FILL_STEPS if steps > FILL_STEPS + 1 else 0
    if skip:
        return (walls[-1] - walls[skip - 1]) / (ends[-1] - ends[skip - 1])
    return walls[-1] / ends[-1]


def replay_schedule(group_s: list[float], cost_s: list[float], max_staleness: int, gps: int, *,
                    max_running: int, straggler_factor: float | None = STRAGGLER_FACTOR,
                    gate: StalenessGate | None = None) -> dict:
    """The async pipeline's schedule in virtual time: group i (in admission order) rolls out
    for group_s[i] seconds, step k trains and publishes for cost_s[k % len] seconds. Driven
    by the pipeline's own parts, as `Pipeline._run_async` drives them: admission while the
    `StalenessGate` allows and fewer than `max_running` groups run; each batch filled earliest
    deadline first with `gate.fits`; a running group that blocks a step (complete groups could
    fill it, or no new group may start) is dropped once it has run past
    `StragglerLimit(straggler_factor)` (None: never).
    A group still outstanding past its deadline is dropped too (`missed`; never with the real
    gate — a variant passed as `gate` may over-admit). Stops when the group times run out.

    Returns {"step_ends": [...], "step_last_group": the highest group index each step trained
    or dropped, "started": n, "dropped": stragglers dropped, "missed": n, "staleness": per
    trained group}."""
    return asyncio.run(_replay(group_s, cost_s, max_staleness, gps, max_running,
                               straggler_factor, gate))


async def _replay(group_s, cost_s, max_staleness, gps, max_running, straggler_factor, gate):
    gate = gate or StalenessGate(max_staleness, gps)
    limit = StragglerLimit(straggler_factor) if straggler_factor is not None else None
    now, nxt, train_end = 0.0, 0, None
    running: dict[int, tuple[int, float]] = {}  # index -> (deadline, admitted at)
    finishing: list[tuple[float, int]] = []  # heap of (end, index)
    pool: list[tuple[int, int]] = []  # complete: (deadline, index)
    batch: list[tuple[int, int]] = []
    out = {"step_ends": [], "step_last_group": [], "started": 0, "dropped": 0, "missed": 0,
           "staleness": []}
    last_group = -1  # the highest index the step being built has trained or dropped
    admitted_at: dict[int, int] = {}  # index -> published version at admission
    while True:
        while nxt < len(group_s) and not gate.would_block() and len(running) < max_running:
            deadline = await gate.acquire()
            running[nxt] = (deadline, now)
            admitted_at[nxt] = gate.published
            heapq.heappush(finishing, (now + group_s[nxt], nxt))
            nxt += 1
            out["started"] += 1
        timer, dropped = None, False
        while train_end is None and len(batch) < gps:
            pool.sort()
            picked = next((g for g in pool if gate.fits((d for d, _ in batch), g[0])), None)
            if picked is not None:
                pool.remove(picked)
                batch.append(picked)
                continue
            # As the pipeline: a straggler blocks when complete groups could fill the step, or
            # when no new group may start (the gate or the running limit is full).
            blocked = (len(pool) + len(batch) >= gps or gate.would_block()
                       or len(running) >= max_running)
            if limit is None or not blocked or not running or limit.limit_s() is None:
                break
            index = min(running, key=lambda i: (running[i][0], i))  # the earliest deadline
            deadline, started = running[index]
            if now < started + limit.limit_s():
                timer = started + limit.limit_s()
                break
            del running[index]
            await gate.release(deadline)
            out["dropped"] += 1
            last_group = max(last_group, index)
            dropped = True
            break
        if dropped:
            continue  # admit its replacement and pick again, at the same time
        if train_end is None and len(batch) == gps:
            train_end = now + cost_s[len(out["step_ends"]) % len(cost_s)]
        events = [t for t in (train_end, timer) if t is not None]
        if finishing:
            events.append(finishing[0][0])
        if not events:
            return out
        now = max(now, min(events))
        if train_end is not None and train_end <= now:
            out["staleness"] += [gate.trained - admitted_at[i] for _, i in batch]
            await gate.step(d for d, _ in batch)
            await gate.publish(gate.trained)
            out["step_last_group"].append(max([last_group] + [i for _, i in batch]))
            batch, train_end, last_group = [], None, -1
            out["step_ends"].append(now)
            for index in [i for i, (d, _) in running.items() if d < gate.trained]:
                await gate.release(running.pop(index)[0])
                out["missed"] += 1
            for item in [g for g in pool if g[0] < gate.trained]:
                pool.remove(item)
                await gate.release(item[0])
                out["missed"] += 1
        while finishing and finishing[0][0] <= now:
            _, index = heapq.heappop(finishing)
            if index in running:  # not dropped meanwhile
                deadline, started = running.pop(index)
                if limit is not None:
                    limit.observe(now - started)
                pool.append((deadline, index))


def ceiling(sync: dict, max_staleness: int) -> float:
    """The most async can gain over this sync run at `max_staleness`, with the same rollout
    time R and train time S per step. A step's groups must be sampled entirely with weights
    at most `max_staleness` versions old, so they start after that version is published and
    the step ends no earlier than R + S later: one step per (R + S) / (max_staleness + 1) at
    best, and never faster than the trainer (S). Sync takes R + S per step."""
    r, s = sync["rollout_s"], sync["train_s"]
    return (r + s) / max(s, (r + s) / (max_staleness + 1))


if __name__ == "__main__":
    main()
