"""Admission and consumption policies under a strict staleness bound, simulated.

What throughput each schedule allows on `benchmarks/pipeline.py`'s workload, with nothing
shared between rollouts and training: group i rolls out for the slowest of its G episodes
(3 turns of one model turn + a lognormal environment step, median 0.1 s, p99 10x: the same
`EpisodeLatencies`), each optimizer step trains and publishes for a fixed cost, and the
schedule is `replay_schedule` from benchmarks/pipeline.py — the real `StalenessGate` and
`StragglerLimit` in virtual time. Every policy keeps the bound strict (no trained group older
than `max_staleness` versions); they differ in what they start and what they drop:

  gate                 admit while every outstanding group can still meet its deadline,
                       train earliest deadline first, wait for a straggler whose deadline has
                       come; never drops
  straggler xF         the gate, plus: a running group that blocks a step which complete
                       groups could fill is dropped once it has run F x the median recent
                       group time (`StragglerLimit`; F = STRAGGLER_FACTOR = 3.5 is the
                       pipeline's default)
  spare +E             over-admission: E groups beyond the gate's capacity, trained earliest
                       deadline first while the others' deadlines allow; a group that misses
                       its deadline is dropped
  arrival +E           E spares and no deadline scheduling: each step trains the first
                       complete groups; a group past its deadline is dropped (how the
                       pipeline consumed before the gate)
  hole -M              M groups fewer than the gate admits: fewer in flight, more choice

Figures: per policy and bound, `ratio` (steps/s over the synchronous loop's on the same group
times) and `dropped` (groups dropped / groups started), over one long run per policy. Then,
for the straggler factors, what `benchmarks/pipeline.py`'s 24-step runs would see over many
latency draws (`short_runs`): the mean and spread of its pooled `stale_dropped_fraction` (the
max_staleness=1 runs with 4 groups per step and with 1), the share of draws above 2%, and the
mean gain of its tail ceiling over the gate alone's at each bound. In steady state a schedule that keeps
E groups beyond (max_staleness + 1) x groups_per_step outstanding must drop at least
E / ((max_staleness + 1) x groups_per_step + E) of what it starts (Little's law: no group
stays longer than max_staleness + 1 steps), so spares cannot fit a 2% drop budget.

Usage: python benchmarks/staleness.py [--quick] [--steps N] [--seed S]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from agentax.pipeline import STRAGGLER_FACTOR, StalenessGate

_spec = importlib.util.spec_from_file_location("pipeline_benchmark",
                                               Path(__file__).with_name("pipeline.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

GROUP_SIZE = 4
MODEL_TURN_S = 0.0171
"""One model turn of the benchmark's workload (benchmarks/results/pipeline.json `model_turn_s`)."""
STEP_COST_S = 0.1
"""Train + publish of one step (`sync_train_s_per_step` 0.095 plus the publish)."""
MAX_RUNNING = 12
"""Groups whose episodes fit the benchmark's 48 engine slots."""


class _SpareGate(StalenessGate):
    """The gate admitting `spares` groups beyond its capacity (negative: holes); `arrival`
    drops deadline scheduling (any complete group fits)."""

    def __init__(self, max_staleness: int, groups_per_step: int, spares: int, arrival: bool):
        super().__init__(max_staleness, groups_per_step)
        self.spares, self.arrival = spares, arrival

    def capacity(self) -> int:
        return super().capacity() + self.spares

    def _forced(self, d: int) -> int:
        return super()._forced(d) - max(self.spares, 0)  # a spare may miss its deadline

    def fits(self, batch, deadline: int) -> bool:
        if self.arrival:
            return len(list(batch)) < self.groups_per_step
        return super().fits(batch, deadline)


def group_times(n: int, seed: int) -> list[float]:
    latencies = bench.EpisodeLatencies(bench.ENV_MEDIAN_S, seed)
    return [max(sum(MODEL_TURN_S + x for x in latencies.next_episode())
                for _ in range(GROUP_SIZE)) for _ in range(n)]


def policies() -> dict:
    """name -> (straggler factor or None, gate variant or None: (spares, arrival))."""
    out = {"gate": (None, None)}
    out.update({f"straggler x{f:g}": (f, None) for f in sorted({2.5, 3.0, STRAGGLER_FACTOR, 4.0})})
    out.update({"spare +1": (None, (1, False)), "spare +2": (None, (2, False)),
                "arrival +0": (None, (0, True)), "arrival +1": (None, (1, True)),
                "hole -1": (None, (-1, False)), "hole -2": (None, (-2, False))})
    return out


def simulate(times: list[float], steps: int, gps: int, max_staleness: int, factor, variant) -> dict:
    sync = [max(times[k * gps:(k + 1) * gps]) + STEP_COST_S for k in range(steps)]
    gate = None if variant is None else _SpareGate(max_staleness, gps, *variant)
    out = bench.replay_schedule(times, [STEP_COST_S], max_staleness, gps, max_running=MAX_RUNNING,
                                straggler_factor=factor, gate=gate)
    ends = out["step_ends"][:steps]
    skip = bench.FILL_STEPS
    assert max(out["staleness"]) <= max_staleness  # every policy keeps the bound strict
    per_step = (ends[-1] - ends[skip - 1]) / (len(ends) - skip)
    return {"ratio": round(sum(sync[skip:]) / (steps - skip) / per_step, 3),
            "dropped": round((out["dropped"] + out["missed"]) / out["started"], 4)}


def short_runs(factor: float, draws: int, steps: int = 24) -> dict:
    """`benchmarks/pipeline.py`'s figures under the straggler rule, over `draws` latency seeds:
    its pooled stale_dropped_fraction and the tail ceiling over the gate alone's."""
    drops, gains = [], {1: [], 2: []}
    for seed in range(1, draws + 1):
        dropped = started = 0
        for gps, s in ((4, 1), (4, 2), (1, 1)):
            times = group_times((steps + s + 1) * gps + 2, seed)
            walls, t = [], 0.0
            for k in range(steps):
                t += max(times[k * gps:(k + 1) * gps]) + STEP_COST_S
                walls.append(t)
            if s == 1:
                out = bench.replay_schedule(times, [STEP_COST_S], s, gps, max_running=MAX_RUNNING,
                                            straggler_factor=factor)
                dropped, started = dropped + out["dropped"], started + out["started"]
            if gps == 4:
                sync = {"step_wall_s": walls, "group_s": times[:steps * gps],
                        "groups_per_step": gps, "max_running_groups": MAX_RUNNING}
                gains[s].append(bench.tail_ceiling(sync, s, factor) / bench.tail_ceiling(sync, s, None))
        drops.append(dropped / started)
    drops.sort()
    return {"dropped_mean": round(sum(drops) / draws, 4),
            "dropped_p10_p90": [round(drops[int(0.1 * (draws - 1))], 4), round(drops[int(0.9 * (draws - 1))], 4)],
            "share_above_0.02": round(sum(d > 0.02 for d in drops) / draws, 2),
            **{f"gain_max_staleness_{s}": round(sum(g) / draws, 3) for s, g in gains.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 steps per run (< 1 minute)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 20,000)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    steps = args.steps or (2000 if args.quick else 20000)
    figures: dict = {}
    for gps in (4, 1):
        # Twice the groups a step count needs: spares and replacements start more.
        times = group_times(2 * steps * gps, args.seed)
        for name, (factor, variant) in policies().items():
            if variant is not None and -variant[0] >= gps:
                continue  # a hole of a whole step: a step could never fill at max_staleness 0
            row = {}
            for s in (1, 2):
                row[s] = simulate(times, steps, gps, s, factor, variant)
                figures[f"{name} gps={gps} max_staleness={s}"] = row[s]
            print(f"gps={gps} {name:15s} " + " | ".join(
                f"s={s}: ratio {r['ratio']:.3f} dropped {r['dropped']:.4f}" for s, r in row.items()),
                flush=True)
    draws = 20 if args.quick else 100
    for factor in sorted({3.0, STRAGGLER_FACTOR, 4.0}):
        row = short_runs(factor, draws)
        figures[f"straggler x{factor:g} short_runs"] = row
        print(f"24-step runs, straggler x{factor:g}, {draws} draws: {row}", flush=True)
    figures.update(steps=steps, seed=args.seed, draws=draws, model_turn_s=MODEL_TURN_S, step_cost_s=STEP_COST_S,
                   workload=f"groups of {GROUP_SIZE}, 3 turns, lognormal env latency median "
                            f"{bench.ENV_MEDIAN_S:g} s p99 10x, {MAX_RUNNING} groups in flight at most")
    if not args.quick:
        os.makedirs(Path(__file__).with_name("results"), exist_ok=True)
        with open(Path(__file__).with_name("results") / "staleness.json", "w") as f:
            json.dump(figures, f, indent=2)
    sys.stdout.flush()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
