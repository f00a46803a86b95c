"""SWE-bench scoring throughput: instances scored per second, 4 parallel sandboxes over 1.

Workload: the swe_real recipe's shipped instances (real packages' own test suites: inflection,
parse, cachetools), each scored with its gold patch through `agentax.envs.score_patches`, the
same path as any SWE-bench-format instance: a fresh sandbox from the repository snapshot, the
patch applied, the named tests run with pytest, their statuses read. The same instances are
scored one sandbox at a time, then 4 at a time; every gold patch must resolve in both runs
(a run that resolves fewer is reported, not hidden).

Each scoring is a sandbox start (bubblewrap, the isolation probe), two short processes (patch,
pytest) and their exits, much of it waiting rather than computing, so on a small host 4
sandboxes can beat 1 by more than the core count; with larger test suites the ratio tends to
the number of cores (`cores` says how many this host has).
Without the sdist cache (scripts/setup.sh), the hand-written instances of tests/data/swebench
are the workload (named in `workload`).

Usage: python benchmarks/swe.py [--quick]. The last line is the JSON of the figures; the full
run writes benchmarks/results/swe.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from agentax.envs import RepoSnapshots, load_swe_instances, score_patches  # noqa: E402
from agentax.recipes import swe_real  # noqa: E402


def _workload(n: int | None):
    try:
        insts, name = swe_real.instances(), "swe_real shipped instances"
        snaps_dirs = [swe_real.sdist_cache_dir()]
    except FileNotFoundError:
        insts = load_swe_instances(ROOT / "tests" / "data" / "swebench" / "instances.jsonl")
        name, snaps_dirs = "tests/data/swebench hand-written instances (no sdist cache)", []
    if n is not None:
        by_repo: dict[str, list] = {}
        for i in insts:
            by_repo.setdefault(i.repo, []).append(i)
        mixed = [g[k] for k in range(max(map(len, by_repo.values()))) for g in by_repo.values() if k < len(g)]
        insts = (mixed * (n // len(mixed) + 1))[:n]
    return insts, name, snaps_dirs


def _run(insts, snaps, concurrency: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    scores = asyncio.run(score_patches([(i, i.patch) for i in insts], snapshots=snaps, concurrency=concurrency))
    return time.perf_counter() - t0, sum(s.resolved for s in scores)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="8 instances (< 60 s)")
    args = p.parse_args()
    insts, workload, dirs = _workload(8 if args.quick else None)
    with tempfile.TemporaryDirectory() as cache:
        snaps = RepoSnapshots(search_dirs=dirs, cache_dir=cache)
        for i in insts:  # prepare every snapshot first: both runs measure scoring only
            snaps.path(i)
        _run(insts[:1], snaps, 1)  # warm: imports, first sandbox
        t1, ok1 = _run(insts, snaps, 1)
        t4, ok4 = _run(insts, snaps, 4)
    n = len(insts)
    cores = os.cpu_count() or 1
    print(f"workload: {workload}, {n} instances scored with their gold patches, {cores} cores")
    print(f"{'sandboxes':>10} {'seconds':>8} {'instances/s':>12} {'resolved':>9}")
    print(f"{1:>10} {t1:>8.1f} {n / t1:>12.2f} {ok1:>5}/{n}")
    print(f"{4:>10} {t4:>8.1f} {n / t4:>12.2f} {ok4:>5}/{n}")
    figures = {
        "swe_scoring_instances_per_s": round(n / t4, 3),
        "swe_scoring_instances_per_s_1_sandbox": round(n / t1, 3),
        "swe_parallel_4_over_1": round(t1 / t4, 3),
        "gold_resolved_fraction": round(min(ok1, ok4) / n, 3),
        "instances": n,
        "cores": cores,
        "workload": workload,
    }
    if not args.quick:
        out = ROOT / "benchmarks" / "results" / "swe.json"
        out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
