"""examples/ray_cluster.py (the Ray layout of docs/scaling.md) runs end to end on a local Ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ray_cluster_example_trains_with_replicas_in_actors():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "ray_cluster.py"), "--address", "local",
         "--replicas", "2", "--env-workers", "2", "--steps", "2"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("steps=2 ") and "down=()" in line, line
    # Both replicas served episodes, and every published version reached them.
    routed = eval(line.split("routed=")[1].split(" down=")[0])  # noqa: S307 - our own tuple
    assert len(routed) == 2 and min(routed) > 0, line
    # Version 0, then one per step: each sent, or replaced in the queue by the next one.
    sent = int(line.split("publications=")[1].split()[0])
    superseded = int(line.split("superseded=")[1].split()[0])
    assert sent + superseded == 3 and sent >= 2, line
