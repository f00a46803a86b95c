"""Writes the swe_real recipe's SWE-bench-format instances from real packages' sdists.

For each package of `agentax.recipes.swe_real.PACKAGES` (its sdist fetched by scripts/setup.sh
into the sdist cache), mutates one function at a time, keeps mutations that break some of the
package's own tests, validates each instance (gold patch resolves, empty patch does not) with
the same scoring as any SWE-bench instance, and writes the JSONL:

    flock /tmp/agentax-heavy.lock python scripts/make_swe_tasks.py --per-package 20

Nothing is downloaded here: a missing sdist is an error naming the command that fetches it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from agentax.envs import RepoSnapshots
from agentax.envs._swe_mutate import make_instances
from agentax.recipes import swe_real


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-package", type=int, default=20, help="instances kept per package")
    p.add_argument("--out", type=Path, default=swe_real.INSTANCES_FILE)
    p.add_argument("--sdist-dir", type=Path, default=None, help="default: the sdist cache")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    sdist_dir = args.sdist_dir or swe_real.sdist_cache_dir()
    snapshots = RepoSnapshots(search_dirs=[sdist_dir])
    rows = []
    for spec in swe_real.PACKAGES:
        if not (sdist_dir / spec["snapshot"]).is_file():
            raise SystemExit(f"{sdist_dir / spec['snapshot']} is missing: run scripts/setup.sh (or "
                             f"pip download --no-deps --no-binary :all: -d {sdist_dir} {spec['requirement']})")
        t0 = time.monotonic()
        insts = asyncio.run(make_instances(
            package=spec["package"], snapshot=spec["snapshot"], snapshots=snapshots,
            package_dirs=spec["package_dirs"], environment_setup=spec.get("environment_setup", ""),
            test_cmd=spec["test_cmd"], max_instances=args.per_package, concurrency=args.concurrency,
            seed=args.seed))
        print(f"{spec['package']}: {len(insts)} instances in {time.monotonic() - t0:.0f} s")
        rows += [i.to_row() for i in sorted(insts, key=lambda i: i.instance_id)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    print(f"wrote {len(rows)} instances to {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
