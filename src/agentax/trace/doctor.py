"""`agentax doctor`: explain a run from its trace, metrics and config.

    from agentax.trace import doctor
    report = doctor.analyze("runs/my-run")
    print(doctor.format_report(report))

`analyze` reads the run back into a `DoctorReport` (the rules that turn it into a verdict are in
`agentax.trace._verdict`); `format_report` prints it. `agentax doctor RUN_DIR --timeline` also
plots the report to RUN_DIR/timeline.png.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
from collections import Counter, defaultdict
from typing import Any, Mapping

import numpy as np

from agentax.trace import names
from agentax.trace._files import CONFIG_FILENAME, METRICS_FILENAME
from agentax.trace._intervals import binned_concurrency, length, merge, step_series_stats
from agentax.trace._metrics import read_metrics
from agentax.trace._reader import TraceData, read_trace
from agentax.trace._verdict import ALL_EQUAL_KNOB, decide, pct

__all__ = ["DoctorReport", "Latency", "StageTime", "analyze", "format_report", "read_knobs"]

STAGES = (names.EPISODE, names.MODEL_CALL, names.ENV_RESET, names.ENV_STEP, names.TOOL_CALL,
          names.REWARD, names.TRAIN_STEP, names.WEIGHT_PUBLISH, names.TRAINER_WAIT,
          names.STALENESS_WAIT, names.PRODUCER_BLOCKED, names.PREFILL, names.DECODE_STEP)
LATENCY_SPANS = (names.MODEL_CALL, names.ENV_RESET, names.ENV_STEP, names.TOOL_CALL,
                 names.REWARD, names.TRAIN_STEP, names.EPISODE)
TIMELINE_BINS = 120
# What an episode's time goes to: its direct children, by kind; the rest is "agent/other".
CATEGORY = {names.MODEL_CALL: "model", names.ENV_STEP: "env", names.ENV_RESET: "env",
            names.TOOL_CALL: "tool", names.REWARD: "reward"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageTime:
    """Time one span name took: union over wall time and summed over all spans."""

    name: str
    count: int
    active_s: float  # wall time during which at least one such span was open
    active_fraction: float  # active_s / wall_s
    total_s: float  # summed durations (> active_s when they overlap)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Latency:
    """Latency distribution of one span name, in seconds."""

    name: str
    count: int
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class DoctorReport:
    """What `agentax doctor` found in a run directory."""

    run_dir: str
    wall_s: float
    stages: tuple[StageTime, ...]
    latencies: tuple[Latency, ...]
    engine_busy_fraction: float | None  # >= 1 active slot (or decode/model call), over the
    engine_full_fraction: float | None  # every slot busy; engine's window (first to last call)
    engine_mean_active: float | None
    engine_mean_waiting: float | None  # time-weighted mean of requests waiting for a slot
    trainer_busy_fraction: float | None  # train + publish, over the trainer's lifetime
    trainer_wait_fraction: float | None  # waiting for groups, over the trainer's lifetime
    episode_time_shares: Mapping[str, float]  # share of episode time: model, env, tool, ...
    staleness: Mapping[int, int]  # versions behind -> count
    knobs: Mapping[str, Any]  # max_concurrency, max_staleness, max_slots, max_tokens (or None)
    bottleneck: str  # environment | trainer | engine_slots | staleness | model | balanced | ...
    verdict: str
    suggestion: str
    episodes: int
    train_steps: int
    metrics_records: int
    timeline_bin_s: float = 0.0
    timeline: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    host: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # cpu_cores, jax_backend
    training_slowdown: float | None = None  # decode step p50 while training / while not
    sft_s: float = 0.0  # the SFT warm start's traced time (`sft` span), before the RL part
    sft_steps: int = 0
    rl_wall_s: float = 0.0  # wall time after the warm start: what the fractions are over
    dropped_groups: Mapping[str, int] = dataclasses.field(default_factory=dict)  # reason -> groups
    dropped_episodes: Mapping[str, int] = dataclasses.field(default_factory=dict)  # reason -> episodes
    dropped_tasks: Mapping[str, int] = dataclasses.field(default_factory=dict)  # all-equal groups by task
    untraced_sft_steps: int = 0  # SFT steps metrics.jsonl logs while the trace has no `sft` span
    roles: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    """Multi-agent episodes, per role: model_calls, model_s (summed model-call time),
    generated_tokens, episodes and reward_mean (from the episode spans' role rewards)."""


def read_knobs(run_dir: str) -> dict[str, Any]:
    """The knobs the doctor talks about, from `config.yaml` (`pipeline.max_concurrency`,
    `pipeline.max_staleness`, `engine.max_slots`, `sampling.max_tokens`, or the same at top
    level); None where absent."""
    path, config = os.path.join(run_dir, CONFIG_FILENAME), {}
    if os.path.exists(path):
        import yaml

        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
    sections = {"max_concurrency": "pipeline", "max_staleness": "pipeline", "max_slots": "engine",
                "max_tokens": "sampling"}
    return {key: (config.get(section) or {}).get(key, config.get(key))
            for key, section in sections.items()}


def _staleness(trace: TraceData, metrics: list[dict]) -> dict[int, int]:
    samples = [v for _, v in trace.counters.get(names.STALENESS, ())]
    if not samples:
        for key in ("staleness", "staleness_max"):
            samples = [r[key] for r in metrics if isinstance(r.get(key), (int, float))]
            if samples:
                break
    return dict(sorted(Counter(int(round(v)) for v in samples).items()))


def _engine(trace: TraceData, by_name, t0: int, t1: int, max_slots: Any):
    # Over the engine's working window, not a phase without generation (an SFT warm start).
    kernels = by_name[names.DECODE_STEP] + by_name[names.PREFILL]
    if spans := kernels + by_name[names.MODEL_CALL]:
        t0, t1 = max(t0, min(s for s, _ in spans)), min(t1, max(e for _, e in spans))
    wall = max(t1 - t0, 1)
    active = trace.counters.get(names.ENGINE_ACTIVE_SLOTS, ())
    waiting = trace.counters.get(names.ENGINE_WAITING, ())
    mean_active = mean_waiting = full = None
    busy = length(kernels) / wall if kernels else None
    if active:
        mean_active, pieces = step_series_stats(active, t0, t1)
        if busy is None:
            busy = sum(e - s for s, e, v in pieces if v > 0) / wall
        cap = max_slots if isinstance(max_slots, (int, float)) and max_slots > 0 \
            else max(v for _, v in active)
        full = sum(e - s for s, e, v in pieces if v >= cap) / wall if cap > 0 else 0.0
    if waiting:
        mean_waiting, _ = step_series_stats(waiting, t0, t1)
    if busy is None and by_name[names.MODEL_CALL]:
        busy = length(by_name[names.MODEL_CALL]) / wall
    return busy, full, mean_active, mean_waiting


def _training_slowdown(by_name) -> float | None:
    """Median decode-step time while a train step runs over the median while none runs: > 1
    when engine and trainer compete for the same compute (None: too little overlap to tell)."""
    train = merge(by_name.get(names.TRAIN_STEP, []))
    starts = [s for s, _ in train]
    during, outside = [], []
    for s, e in by_name.get(names.DECODE_STEP, []):
        i = bisect.bisect_right(starts, s) - 1
        (during if i >= 0 and train[i][1] >= e else outside).append(e - s)
    if len(during) < 5 or len(outside) < 5:
        return None
    return float(np.median(during) / max(np.median(outside), 1))


def _episode_shares(trace: TraceData) -> dict[str, float]:
    total = sum(s.dur_ns for s in trace.spans if s.name == names.EPISODE)
    if not total:
        return {}
    shares: dict[str, float] = defaultdict(float)
    for s in trace.spans:
        # (a multi-agent episode's model calls sit on a track of their role, at its top)
        if s.track.startswith(names.EPISODE_TRACK_PREFIX) and s.name in CATEGORY \
                and (s.depth == 1 or names.ARG_ROLE in s.args):
            shares[CATEGORY[s.name]] += s.dur_ns / total
    shares["agent/other"] = max(0.0, 1.0 - sum(shares.values()))
    return dict(shares)


def _roles(trace: TraceData) -> dict[str, dict[str, float]]:
    """Time and reward per role of multi-agent episodes (empty for single-agent runs)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in trace.spans:
        if s.name == names.MODEL_CALL and names.ARG_ROLE in s.args:
            row = out[str(s.args[names.ARG_ROLE])]
            row["model_calls"] += 1
            row["model_s"] += s.dur_ns / 1e9
            row["generated_tokens"] += float(s.args.get("generated_tokens", 0) or 0)
        elif s.name == names.EPISODE and names.ARG_ROLE_REWARDS in s.args:
            rewards = s.args[names.ARG_ROLE_REWARDS]
            if isinstance(rewards, str):  # a mapping is written as its JSON text
                try:
                    rewards = json.loads(rewards)
                except ValueError:
                    continue
            if not isinstance(rewards, Mapping):
                continue
            for role, reward in rewards.items():
                row = out[str(role)]
                row["episodes"] += 1
                row["reward_sum"] += float(reward)
    result = {}
    for role, row in sorted(out.items()):
        n = row.pop("reward_sum", 0.0)
        if row.get("episodes"):
            row["reward_mean"] = n / row["episodes"]
        result[role] = dict(row)
    return result


def _dropped(trace: TraceData) -> dict[str, dict[str, int]]:
    """Groups and episodes the pipeline dropped, by reason; all-equal groups by task."""
    groups: Counter = Counter()
    episodes: Counter = Counter()
    tasks: Counter = Counter()
    for i in trace.instants_named(names.GROUP_DROPPED):
        reason = str(i.args.get("reason", "?"))
        groups[reason] += 1
        episodes[reason] += int(i.args.get("episodes", 0) or 0)
        if reason == "all_equal_rewards":
            tasks[str(i.args.get("task_id", "?"))] += 1
    return {"dropped_groups": dict(groups), "dropped_episodes": dict(episodes),
            "dropped_tasks": dict(tasks.most_common())}


def analyze(run_dir: str | os.PathLike, *, bins: int = TIMELINE_BINS) -> DoctorReport:
    """Read RUN_DIR's trace (+ metrics.jsonl, config.yaml) and explain where time went.

    Args:
      run_dir: a run directory holding `trace.perfetto-trace` (and its resume segments).
      bins: resolution of the utilisation timeline kept in the report.
    Returns:
      A `DoctorReport`; `format_report` prints it.
    """
    run_dir = os.fspath(run_dir)
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory {run_dir!r} does not exist")
    trace = read_trace(run_dir)  # every segment: a resumed run is read whole
    metrics_path = os.path.join(run_dir, METRICS_FILENAME)
    metrics = read_metrics(metrics_path) if os.path.exists(metrics_path) else []
    knobs = read_knobs(run_dir)
    notes = () if trace.spans else ("the trace holds no spans; was anything instrumented?",)
    t0, t1 = trace.start_ns, trace.end_ns
    by_name: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for s in trace.spans:
        by_name[s.name].append((s.start_ns, s.end_ns))
    # The SFT warm start comes first and generates nothing: every fraction below is over the
    # RL part after it (the header says how long each took).
    sft_spans = trace.spans_named(names.SFT)
    sft_ns = length(by_name.get(names.SFT, []))
    if sft_spans:
        t0 = min(max(t0, max(s.end_ns for s in sft_spans)), t1)
    full_wall = max(trace.end_ns - trace.start_ns, 1)
    wall = max(t1 - t0, 1)

    stages = tuple(StageTime(name=n, count=len(by_name[n]), active_s=length(by_name[n]) / 1e9,
                             active_fraction=length(by_name[n]) / wall,
                             total_s=sum(e - s for s, e in by_name[n]) / 1e9)
                   for n in STAGES if by_name.get(n))
    latencies = []
    for n in LATENCY_SPANS:
        durs = [(e - s) / 1e9 for s, e in by_name.get(n, ())]
        if durs:
            p50, p95, p99 = (float(x) for x in np.percentile(durs, (50, 95, 99)))
            latencies.append(Latency(name=n, count=len(durs), p50_s=p50, p95_s=p95, p99_s=p99,
                                     max_s=max(durs)))

    engine_busy, engine_full, mean_active, mean_waiting = _engine(
        trace, by_name, t0, t1, knobs["max_slots"])
    trainer_spans = by_name.get(names.TRAIN_STEP, []) + by_name.get(names.WEIGHT_PUBLISH, [])
    trainer_wait_spans = by_name.get(names.TRAINER_WAIT, [])
    trainer_busy = trainer_wait = None
    if trainer_spans or trainer_wait_spans:
        everything = trainer_spans + trainer_wait_spans
        life = max(max(e for _, e in everything) - min(s for s, _ in everything), 1)
        trainer_busy = length(trainer_spans) / life
        trainer_wait = length(trainer_wait_spans) / life

    bin_ns = max(wall // bins, 1)
    timeline = {n: tuple(binned_concurrency(by_name[n], t0, bin_ns, bins).round(4).tolist())
                for n in STAGES if by_name.get(n) and n != names.EPISODE}
    for cname in (names.ENGINE_ACTIVE_SLOTS, names.ENGINE_WAITING, names.QUEUE_DEPTH):
        samples = trace.counters.get(cname)
        if samples:
            _, pieces = step_series_stats(samples, t0, t1)
            acc = np.zeros(bins)
            for s, e, v in pieces:
                acc += v * binned_concurrency([(s, e)], t0, bin_ns, bins)
            timeline[cname] = tuple(acc.round(4).tolist())

    fields = dict(
        run_dir=run_dir, wall_s=full_wall / 1e9, stages=stages, latencies=tuple(latencies),
        engine_busy_fraction=engine_busy, engine_full_fraction=engine_full,
        engine_mean_active=mean_active, engine_mean_waiting=mean_waiting,
        trainer_busy_fraction=trainer_busy, trainer_wait_fraction=trainer_wait,
        episode_time_shares=_episode_shares(trace),
        staleness=_staleness(trace, metrics),
        knobs=knobs,
        episodes=len(by_name.get(names.EPISODE, ())),
        train_steps=len(by_name.get(names.TRAIN_STEP, ())), metrics_records=len(metrics),
        timeline_bin_s=bin_ns / 1e9, timeline=timeline, notes=notes,
        host=next((dict(i.args) for i in trace.instants_named(names.HOST_INFO)[::-1]), {}),
        training_slowdown=_training_slowdown(by_name),
        sft_s=sft_ns / 1e9, rl_wall_s=wall / 1e9,
        sft_steps=sum(int(s.args.get("steps", 0) or 0) for s in sft_spans),
        untraced_sft_steps=0 if sft_spans else sum(r.get("phase") == "sft" for r in metrics),
        roles=_roles(trace), **_dropped(trace))
    bottleneck, verdict, suggestion = decide(fields, by_name, wall)
    equal = fields["dropped_episodes"].get("all_equal_rewards", 0)
    if fields["train_steps"] and equal and equal >= fields["episodes"] / 2:
        fields["notes"] = (*notes, f"{equal} of {fields['episodes']} episodes were dropped as "
                           f"groups with all-equal rewards (most by task: "
                           f"{', '.join(list(fields['dropped_tasks'])[:3])}); {ALL_EQUAL_KNOB}")
    return DoctorReport(bottleneck=bottleneck, verdict=verdict, suggestion=suggestion, **fields)


def _pct(x: float | None) -> str:
    return f"{pct(x, 1):>6}"


def _covers(report: DoctorReport) -> str:
    """What the wall time covers: the SFT warm start apart from the RL part."""
    if report.sft_s:
        return (f"  = SFT warm start {report.sft_s:.2f} s ({report.sft_steps} steps) + RL part "
                f"{report.rl_wall_s:.2f} s (evaluations included); every share below is of the "
                f"RL part")
    if report.untraced_sft_steps:
        return (f"  covers only what the trace holds: metrics.jsonl logs SFT steps "
                f"({report.untraced_sft_steps} rows) that the trace has no `sft` span for, so "
                f"the warm start's time is left out")
    return "  from the first traced event to the last (no SFT warm start traced)"


def _dropped_line(report: DoctorReport) -> list[str]:
    if not report.dropped_groups:
        return []
    parts = ", ".join(f"{reason} {n} groups ({report.dropped_episodes.get(reason, 0)} episodes)"
                      for reason, n in sorted(report.dropped_groups.items(), key=lambda kv: -kv[1]))
    return [f"  dropped groups         {parts}"]


def format_report(report: DoctorReport) -> str:
    """The report as text: stages, utilisation, latencies, staleness, verdict."""
    lines = [f"agentax doctor: {report.run_dir}",
             f"wall time {report.wall_s:.2f} s, {report.episodes} episodes, {report.train_steps} "
             f"train steps, {report.metrics_records} metrics records", _covers(report), "",
             "Wall time by stage          active    share   summed  count"]
    for st in report.stages:
        lines.append(f"  {st.name:<22} {st.active_s:9.2f} s {_pct(st.active_fraction)} "
                     f"{st.total_s:8.1f} s {st.count:6d}")
    lines += ["", "Utilisation",
              f"  engine busy            {_pct(report.engine_busy_fraction)}"
              f"   all slots full {_pct(report.engine_full_fraction)}",
              "  engine mean active     " + ("   n/a" if report.engine_mean_active is None
                                             else f"{report.engine_mean_active:6.1f}")
              + "   mean waiting   " + ("   n/a" if report.engine_mean_waiting is None
                                        else f"{report.engine_mean_waiting:6.1f}"),
              f"  trainer busy           {_pct(report.trainer_busy_fraction)}"
              f"   waiting for groups {_pct(report.trainer_wait_fraction)}"]
    if report.training_slowdown is not None:
        lines.append(f"  decode step while training {report.training_slowdown:5.2f}x"
                     "   (p50, over decode steps with no train step running)")
    if report.host:
        lines.append("  host                   " + ", ".join(f"{k}={v}" for k, v in
                                                          report.host.items()))
    if report.episode_time_shares:
        shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(
            report.episode_time_shares.items(), key=lambda kv: -kv[1]))
        lines.append(f"  episode time           {shares}")
    lines += _dropped_line(report)
    if report.roles:
        lines += ["", "Roles                  model calls  model time   tokens  episodes  reward"]
        for role, row in report.roles.items():
            reward = f"{row['reward_mean']:7.3f}" if "reward_mean" in row else "    n/a"
            lines.append(f"  {role:<22} {int(row.get('model_calls', 0)):9d} "
                         f"{row.get('model_s', 0.0):9.2f} s {int(row.get('generated_tokens', 0)):8d} "
                         f"{int(row.get('episodes', 0)):9d} {reward}")
    lines += ["", "Latency (s)                  count      p50      p95      p99      max"]
    for lat in report.latencies:
        lines.append(f"  {lat.name:<22} {lat.count:8d} {lat.p50_s:8.3f} {lat.p95_s:8.3f} "
                     f"{lat.p99_s:8.3f} {lat.max_s:8.3f}")
    lines += ["", "Staleness (versions behind: count)"]
    total = sum(report.staleness.values()) or 1
    lines += [f"  {k:>3}: {v:6d}  {100 * v / total:5.1f}%" for k, v in report.staleness.items()
              ] or ["  no staleness samples"]
    knobs = ", ".join(f"{k}={v}" for k, v in report.knobs.items())
    lines += ["", f"Knobs: {knobs}", "", f"Bottleneck: {report.bottleneck}",
              f"Verdict: {report.verdict}", f"Suggestion: {report.suggestion}"]
    lines += [f"Note: {n}" for n in report.notes]
    return "\n".join(lines)
