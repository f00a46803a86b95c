"""The doctor on real runs: a real tiny pipeline (engine, collector, trainer; tests/trace/
tiny_pipeline.py) with one injected bottleneck each; the verdict and the knob it names.

All runs share one engine and trainer (compiled once by the module fixture); each traced run
is 4 optimizer steps, a few seconds. Whether following the advice helps is measured by
benchmarks/trace.py (`doctor_advice`), not asserted here (no wall-clock assertions in tests).
"""

import pytest

from agentax.trace import doctor, names, read_trace

pytest.importorskip("jax")
from tiny_pipeline import WORKLOADS, TinyPipeline  # noqa: E402

STEPS = 4


@pytest.fixture(scope="module")
def pipeline():
    tiny = TinyPipeline()
    for work in WORKLOADS.values():  # compile every shape the runs below need, untraced
        tiny.run(work, 1)
    yield tiny
    tiny.close()


def _report(pipeline, tmp_path, workload):
    result = pipeline.run(WORKLOADS[workload], STEPS, str(tmp_path))
    result.accounting.check()
    report = doctor.analyze(tmp_path)
    assert report.train_steps == STEPS and report.episodes >= STEPS * 4
    # Each file starts with a sample of every engine counter, also those unchanged since
    # the untraced runs before it (evictions stay 0 here).
    assert {names.ENGINE_ACTIVE_SLOTS, names.ENGINE_WAITING, names.ENGINE_EVICTIONS} <= set(
        read_trace(tmp_path).counters)
    return report, doctor.format_report(report)


@pytest.mark.parametrize("workload,bottleneck,knob", [
    # 3 environment steps of 150 ms per episode, 4 episodes at a time, 16 engine slots.
    ("environment", "environment", "raise pipeline.max_concurrency from 4 to about 16"),
    # 600 ms added to every train step.
    ("trainer", "trainer", "make the train step faster"),
    # 100 generated tokens per episode, 2 episodes at a time, free engine slots.
    ("model", "model", "raise pipeline.max_concurrency from 2 to about 4"),
    # Rollouts and training take turns (max_staleness=0); every 4th episode takes 500 ms.
    ("staleness", "staleness", "raise pipeline.max_staleness from 0 to"),
])
def test_verdict_and_knob_on_a_real_pipeline(pipeline, tmp_path, workload, bottleneck, knob):
    report, text = _report(pipeline, tmp_path, workload)
    assert report.bottleneck == bottleneck, text
    assert knob in report.suggestion, text
    assert f"Bottleneck: {bottleneck}" in text
    shares = report.episode_time_shares
    if bottleneck == "environment":
        assert shares["env"] > 0.5 and report.trainer_wait_fraction > 0.5
    if bottleneck == "model":
        assert shares["model"] > 0.5 and report.engine_busy_fraction > 0.3
    if bottleneck == "trainer":
        lat = {l.name: l for l in report.latencies}
        assert lat[names.TRAIN_STEP].p50_s >= WORKLOADS["trainer"].train_sleep_s


def test_staleness_advice_warns_when_engine_and_trainer_share_cores(pipeline, tmp_path):
    # The same turn-taking run with a train step that computes instead of sleeping. On the
    # cpu backend the doctor cannot promise that overlapping them helps, and says so.
    report, text = _report(pipeline, tmp_path, "staleness_shared")
    assert report.bottleneck == "staleness", text
    assert report.host["cpu_cores"] >= 1 and report.host["jax_backend"] == "cpu"
    assert "share the same" in report.suggestion, text
