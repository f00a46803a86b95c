"""The doctor names the right bottleneck on synthetic runs with a known one (exact numbers on a
virtual clock); tests/trace/test_doctor_real.py checks the verdicts on real pipelines."""

import os

import pytest

from agentax.trace import Tracer, doctor, names
from synthetic_run import SCENARIOS, SyntheticRun, simulate_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for scenario in SCENARIOS:
        run_dir = str(tmp_path_factory.mktemp(scenario))
        simulate_run(run_dir, scenario)
        out[scenario] = doctor.analyze(run_dir)
    return out


@pytest.mark.parametrize("scenario,knob", [
    ("environment", "pipeline.max_concurrency from 16 to about"),
    ("trainer", "make the train step faster"),
    ("engine_slots", "engine.max_slots from 4 to about 16"),
    ("staleness", "pipeline.max_staleness from 0 to"),
])
def test_verdict_names_the_known_bottleneck(runs, scenario, knob):
    report = runs[scenario]
    assert report.bottleneck == scenario
    assert knob in report.suggestion
    text = doctor.format_report(report)
    assert f"Bottleneck: {scenario}" in text and report.verdict in text


def test_report_numbers_match_the_synthetic_run(runs):
    env = runs["environment"]
    cfg = SCENARIOS["environment"]
    assert env.episodes == cfg.train_steps * cfg.group_size and env.train_steps == cfg.train_steps
    lat = {l.name: l for l in env.latencies}
    assert lat[names.MODEL_CALL].p50_s == pytest.approx(cfg.model_s, rel=1e-6)
    assert lat[names.TRAIN_STEP].p99_s == pytest.approx(cfg.train_s, rel=1e-6)
    assert lat[names.ENV_STEP].p99_s > 2 * lat[names.ENV_STEP].p50_s  # lognormal tail
    assert env.trainer_wait_fraction > 0.5 and env.engine_mean_waiting < 1
    assert max(env.episode_time_shares, key=env.episode_time_shares.get) == "env"
    assert env.knobs == {"max_concurrency": 16, "max_staleness": 2, "max_slots": 32,
                         "max_tokens": None}
    assert env.metrics_records == cfg.train_steps
    trainer = runs["trainer"]
    assert trainer.trainer_busy_fraction > 0.9
    slots = runs["engine_slots"]
    assert slots.engine_full_fraction > 0.8 and slots.engine_mean_waiting > 5
    assert set(runs["staleness"].staleness) == {0}  # max_staleness=0 is the synchronous loop
    assert max(runs["trainer"].staleness) == SCENARIOS["trainer"].max_staleness


def test_balanced_run_and_missing_config(tmp_path):
    cfg = SyntheticRun(max_concurrency=8, max_slots=16, max_staleness=4, env_s=0.2,
                       model_s=0.1, train_s=0.6, train_steps=10)
    simulate_run(tmp_path, cfg)
    os.remove(tmp_path / "config.yaml")
    report = doctor.analyze(tmp_path)
    assert report.bottleneck == "balanced", doctor.format_report(report)
    assert report.knobs == {"max_concurrency": None, "max_staleness": None, "max_slots": None,
                            "max_tokens": None}


def test_timeline_series_and_errors(runs, tmp_path):
    assert set(runs["engine_slots"].timeline) >= {names.MODEL_CALL, names.ENGINE_WAITING}
    with pytest.raises(FileNotFoundError, match="trace.perfetto-trace"):
        doctor.analyze(tmp_path)


def test_decode_slowdown_while_training_turns_staleness_advice_into_a_warning(tmp_path):
    # Decode steps take 10 ms alone and 30 ms while a train step runs: shared compute.
    now = [10**9]
    tracer = Tracer(clock=lambda: now[0])
    tracer.start(tmp_path)
    for step in range(6):
        for _ in range(3):
            with tracer.span(names.DECODE_STEP, track=names.ENGINE_TRACK):
                now[0] += 10_000_000
        with tracer.span(names.TRAIN_STEP, track=names.TRAINER_TRACK):
            now[0] += 1_000
            for _ in range(2):
                with tracer.span(names.DECODE_STEP, track=names.ENGINE_TRACK):
                    now[0] += 30_000_000
    tracer.close()
    report = doctor.analyze(tmp_path)
    assert report.training_slowdown == pytest.approx(3.0)
    assert "decode step while training  3.00x" in doctor.format_report(report)
    from agentax.trace._verdict import _shared_compute

    fields = {"training_slowdown": report.training_slowdown, "host": report.host}
    assert "will not help here" in _shared_compute(fields)
    assert _shared_compute({"training_slowdown": 1.0, "host": {"jax_backend": "gpu"}}) == ""
    assert "share the same 2 cores" in _shared_compute(
        {"training_slowdown": None, "host": {"jax_backend": "cpu", "cpu_cores": 2}})


def test_engine_utilisation_is_over_the_engine_window_not_a_warm_start_before_it(tmp_path):
    # 10 s without generation (an SFT warm start), then 2 s in which the engine decodes 1.5 s
    # with 4 slots active: busy 75 %, not 1.5 / 12.
    now = [10**9]
    tracer = Tracer(clock=lambda: now[0])
    tracer.start(tmp_path)
    with tracer.span("sft", track=names.TRAINER_TRACK):
        now[0] += 10 * 10**9
    tracer.counter(names.ENGINE_ACTIVE_SLOTS, 4)
    for step in range(3):
        now[0] += 250_000_000 if step else 0
        with tracer.span(names.DECODE_STEP, track=names.ENGINE_TRACK):
            now[0] += 500_000_000
    tracer.close()
    report = doctor.analyze(tmp_path)
    assert report.wall_s == pytest.approx(12.0, rel=1e-3)
    assert report.engine_busy_fraction == pytest.approx(0.75, rel=1e-3)
    assert report.engine_mean_active == pytest.approx(4.0)


def test_wall_time_starts_at_the_first_traced_work_not_at_tracer_start(tmp_path):
    # The tracer starts (its host_info instant), 10 s pass untraced (an SFT warm start, as in
    # `agentax train`), then 2 s of episodes: the report's wall time is 2 s and episodes fill it
    # (it read 12 s and a 1/6 share, and the demo's report 40 s for a 13 s traced window).
    now = [10**9]
    tracer = Tracer(clock=lambda: now[0])
    tracer.start(tmp_path)
    now[0] += 10 * 10**9
    for k in range(4):
        with tracer.span(names.EPISODE, track=names.episode_track(str(k))):
            now[0] += 500_000_000
    tracer.close()
    report = doctor.analyze(tmp_path)
    assert report.host  # the instant is still read
    assert report.wall_s == pytest.approx(2.0, rel=1e-6)
    episode = next(s for s in report.stages if s.name == names.EPISODE)
    assert episode.active_fraction == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("max_tokens,shorten", [(256, True), (8, False)])
def test_generation_bound_advice_skips_max_tokens_already_at_its_floor(tmp_path, max_tokens,
                                                                      shorten):
    # Model calls dominate, concurrency already equals the slots: the advice would be shorter
    # generations, unless sampling.max_tokens is already at the floor (it said so at 8).
    cfg = SyntheticRun(max_concurrency=8, max_slots=8, max_staleness=4, env_s=0.01,
                       env_sigma=0.1, tool_s=0.01, reward_s=0.01, model_s=1.0, train_s=0.1)
    simulate_run(tmp_path, cfg)
    with open(tmp_path / "config.yaml", "a", encoding="utf-8") as f:
        f.write(f"sampling:\n  max_tokens: {max_tokens}\n")
    report = doctor.analyze(tmp_path)
    assert report.bottleneck == "model", doctor.format_report(report)
    assert report.knobs["max_tokens"] == max_tokens
    assert ("shorten generations" in report.suggestion) == shorten, report.suggestion
    if not shorten:
        assert "already short (sampling.max_tokens=8)" in report.suggestion


def test_an_environment_bound_run_whose_time_is_the_browsers_is_called_browser_bound(tmp_path):
    """The synthetic environment-bound run, re-decided with browser spans inside its env steps:
    60 % of the environment time in the browser reads "Browser-bound" and advises more worker
    processes; 30 % stays "Environment-bound"."""
    import dataclasses
    from collections import defaultdict

    from agentax.trace import _verdict
    from agentax.trace._reader import read_trace

    simulate_run(tmp_path, "environment")
    report = doctor.analyze(tmp_path)
    trace = read_trace(str(tmp_path))
    by_name = defaultdict(list)
    for s in trace.spans:
        by_name[s.name].append((s.start_ns, s.end_ns))
    fields = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)
              if f.name not in ("bottleneck", "verdict", "suggestion")}
    wall = max(trace.end_ns - trace.start_ns, 1)
    verdicts = {}
    for share in (0.6, 0.3):
        with_browser = dict(by_name)
        with_browser[names.BROWSER_ACTION] = [
            (s, s + int(share * (e - s))) for s, e in by_name[names.ENV_STEP]]
        verdicts[share] = _verdict.decide(fields, with_browser, wall)
    assert verdicts[0.6][0] == verdicts[0.3][0] == "environment"
    env_ns = sum(e - s for n in (names.ENV_RESET, names.ENV_STEP) for s, e in by_name[n])
    expected = 0.6 * sum(e - s for s, e in by_name[names.ENV_STEP]) / env_ns  # resets: no browser
    assert verdicts[0.6][1].startswith("Browser-bound")
    assert f"{100 * expected:.0f}% of the environments' time went to the browser" in verdicts[0.6][1]
    assert "RayEnvPool" in verdicts[0.6][2]
    assert verdicts[0.3][1].startswith("Environment-bound") and "RayEnvPool" not in verdicts[0.3][2]
    assert report.verdict.startswith("Environment-bound")  # no browser spans: as before
