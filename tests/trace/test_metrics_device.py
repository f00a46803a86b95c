"""Metrics sinks, device spans and the profiler window."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentax.trace import Tracer, names, read_trace
from agentax.trace import MetricsLogger, read_metrics


def test_metrics_jsonl_tensorboard_and_console(tmp_path):
    updates = []

    class View:  # what the CLI's progress bar receives
        def update(self, step, record):
            updates.append((step, record["loss"]))

        def close(self):
            updates.append("closed")

    with MetricsLogger(tmp_path, tensorboard=True, console=View()) as logger:
        for step in range(3):
            logger.log(step, {"loss": np.float32(1.5 / (step + 1)), "reward": step, "note": "x",
                              "nan": float("nan")})
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[2]["loss"] == pytest.approx(0.5) and records[0]["nan"] == "nan"
    with open(tmp_path / "metrics.jsonl") as f:
        assert all(json.loads(line)["note"] == "x" for line in f)
    assert any(name.startswith("events.out.tfevents") for name in
               os.listdir(tmp_path / "tensorboard"))
    assert updates[-2:] == [(2, pytest.approx(0.5)), "closed"]


def test_device_span_ends_after_block(tmp_path):
    tracer = Tracer()
    tracer.start(tmp_path)
    matmul = jax.jit(lambda x: x @ x)
    x = jnp.ones((32, 32))
    for step in range(3):
        with tracer.device_span(names.TRAIN_STEP, args={"step": step}) as span:
            out = span.block(matmul(x))
    with tracer.device_span(names.DEVICE_CALL):
        matmul(x)
    tracer.close()
    assert float(out[0, 0]) == 32.0
    trace = read_trace(tmp_path / "trace.perfetto-trace")
    steps = trace.spans_named(names.TRAIN_STEP)
    assert [s.args for s in steps] == [{"step": i, "blocked": True} for i in range(3)]
    assert trace.spans_named(names.DEVICE_CALL)[0].args == {"blocked": False}
