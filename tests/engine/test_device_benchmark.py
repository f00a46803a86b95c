"""benchmarks/device.py: its CPU skip path (run in CI), and its logic on tiny shapes (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=600, env=env)


def test_device_benchmark_skips_on_cpu_with_a_clear_message():
    out = _run()
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert "skipped: no GPU or TPU found" in lines[0]
    assert "accelerator" in json.loads(lines[-1])["skipped"]


@pytest.mark.slow
def test_device_benchmark_logic_on_tiny_shapes():
    out = _run("--cpu-smoke")
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("decode_tokens_per_s_b4_ctx128", "decode_roofline_frac_b8_ctx512",
                "prefill_mfu", "train_step_mfu_2x64", "train_predicted_peak_bytes_2x64"):
        assert figures[key] > 0, key
    assert figures["train_loss_finite_2x64"] is True
    # Engine kernels only: decode once per page pool of 2 batches x 2 contexts, prefill once.
    assert figures["engine_compiles"] == 4 + 1
