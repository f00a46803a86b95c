"""The doctor on real runs: a real tiny pipeline (engine, collector, trainer; tests/trace/
tiny_pipeline.py) with one injected bottleneck each; the verdict and the knob it names.

All runs share one engine and trainer (compiled once by the module fixture); each traced run
is 4 optimizer steps, a few seconds. Whether following the advice helps is measured by
benchmarks/trace.py (`doctor_advice`), not asserted here (no wall-clock assertions in tests).
"""

import dataclasses

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


async def _black_box_agent(client, task):
    """An OpenAI-API agent: it calls the model itself, through the engine's endpoint."""
    from agentax.serve import Reward

    reply = await client.chat.completions.create(
        model="agentax", messages=[{"role": "user", "content": task.prompt}])
    return Reward(float(len(reply.choices[0].message.content or "")))


def test_a_black_box_agents_model_calls_are_its_episodes_model_time(pipeline, tmp_path):
    # The "model" workload (100 tokens a call, 2 episodes at a time), but the episodes are an
    # OpenAI-API agent's: its calls reach the engine through the endpoint, not the collector.
    pytest.importorskip("openai")
    from agentax.serve import OpenAIAgentEnvironment

    result = pipeline.run(WORKLOADS["model"], STEPS, str(tmp_path),
                          env_factory=lambda: OpenAIAgentEnvironment(_black_box_agent))
    result.accounting.check()
    report = doctor.analyze(tmp_path)
    text = doctor.format_report(report)
    trace = read_trace(tmp_path)
    calls = trace.spans_named(names.MODEL_CALL)
    assert len(calls) >= report.episodes >= STEPS * 4
    # Each call lies on its episode's track, inside the episode; only a call still running
    # when the run's end cancelled its episode outlives it (on a lane beside the track).
    episodes = {s.track: s for s in trace.spans_named(names.EPISODE)}
    for call in calls:
        episode = episodes[call.track.split(" [")[0]]
        assert call.depth == 1 or episode.args.get(names.ARG_ERROR) == call.args.get(
            names.ARG_ERROR) == "CancelledError", (call, episode)
    assert sum(c.depth == 1 for c in calls) >= STEPS * 4
    assert report.episode_time_shares["model"] > 0.5, text
    assert report.bottleneck == "model" and "raise pipeline.max_concurrency from 2" in \
        report.suggestion, text


def test_every_group_dropped_as_all_equal_names_the_case_and_the_knob(pipeline, tmp_path):
    # Every episode gets reward 0.25: each group is all-equal, the default filter drops it,
    # and the run stops after 16 dropped episodes (pipeline.max_dropped_episodes).
    from agentax.pipeline import RunFailed

    work = dataclasses.replace(WORKLOADS["trainer"], train_sleep_s=0.0, reward=0.25,
                               filters=("all_equal_rewards",), max_dropped_episodes=16)
    with pytest.raises(RunFailed):
        pipeline.run(work, STEPS, str(tmp_path))
    report = doctor.analyze(tmp_path)
    text = doctor.format_report(report)
    assert report.train_steps == 0 and report.bottleneck == "all_filtered", text
    groups = report.dropped_groups["all_equal_rewards"]
    assert groups >= 8 and report.dropped_episodes["all_equal_rewards"] == 2 * groups
    assert f"{groups} groups ({2 * groups} episodes) were dropped" in report.verdict
    assert set(report.dropped_tasks) <= {"t0", "t1", "t2", "t3"} and "t0 (" in report.verdict
    assert "pipeline.filters=[]" in report.suggestion and "sft.steps" in report.suggestion
    assert "No train steps were traced" not in text and "dropped groups" in text
