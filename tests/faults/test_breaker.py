"""Runs that cannot make progress stop with one line naming the cause (the failure breaker).

Each case runs the real pipeline (tiny real engine and trainer, real collector) against one
injected fault and checks that `Pipeline.run` raises `RunFailed` — instead of spinning — with
a one-line message that names the cause, a sample error and the knob, and that every started
episode is still accounted for.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from flax import nnx

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import Environment
from agentax.models import ModelConfig, Transformer
from agentax.pipeline import Pipeline, PipelineConfig, RunFailed
from agentax.records import Observation, SamplingParams, StepResult, Task
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer
from agentax.train import RLTrainer, TrainerConfig

MODEL = ModelConfig.tiny(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=2,
                         num_kv_heads=1, head_dim=16)
TASKS = [Task(id="t0", prompt="Say hi.")]
ENGINE = EngineConfig(max_slots=4, max_seq_len=64, prefill_chunk=32, decode_steps_per_call=2)


class Run:
    """A real engine, trainer and collector around `env_factory`."""

    def __init__(self, env_factory, **collector_kw):
        tok = ByteTokenizer()
        model = Transformer(MODEL, rngs=nnx.Rngs(0))
        self.engine = Engine(model, ENGINE, eos_token_ids=tok.eos_token_ids, tokenizer=tok)
        self.trainer = RLTrainer(model, TrainerConfig(micro_batch_size=4, max_seq_len=64,
                                                      min_seq_bucket=64))
        limits = dict(max_turns=2, max_episode_tokens=60, close_timeout_s=0.5)
        self.collector = Collector(self.engine, tok, env_factory, lambda: ModelAgent(),
                                   SamplingParams(temperature=1.0, max_tokens=4),
                                   CollectorConfig(**{**limits, **collector_kw}))

    def pipeline(self, **cfg) -> Pipeline:
        config = PipelineConfig(**{"group_size": 2, "groups_per_step": 1, "max_concurrency": 4,
                                   "filters": (), "breaker_window": 8, **cfg})
        return Pipeline(self.collector, self.trainer, self.engine, TASKS, config)


@pytest.fixture
def make_run():
    made = []

    def make(env_factory, **kw):
        run = Run(env_factory, **kw)
        made.append(run)
        return run

    yield make
    for run in made:
        run.engine.shutdown()


def _stopped(pipeline: Pipeline, cause: str, *, trains: bool = False) -> RunFailed:
    with pytest.raises(RunFailed) as info:
        pipeline.run(3)
    error = info.value
    assert error.cause == cause, str(error)
    assert "\n" not in str(error) and str(error).startswith("run stopped: ")
    pipeline.accounting.check()  # every started episode is counted
    assert pipeline.accounting.started > 0
    if not trains:
        assert pipeline.accounting.trained == 0
    return error


class ResetRaises(Environment):
    async def _reset(self, task):
        raise RuntimeError("the dataset file is missing")

    async def _step(self, action):
        raise AssertionError("never reached")


class EchoEnv(Environment):
    async def _reset(self, task):
        return Observation(content=task.prompt)

    async def _step(self, action):
        return StepResult(observation=Observation(content="ok"), reward=float(len(action.text) % 2),
                          done=True)


def test_always_failing_environment_stops_the_run(make_run):
    run = make_run(ResetRaises)
    error = _stopped(run.pipeline(), "failures")
    msg = str(error)
    assert "all of the last 8 episodes failed with env_error (reset_exception)" in msg
    assert "the dataset file is missing" in msg
    assert "pipeline.breaker_window" in msg and "fix the environment" in msg


def test_failure_rate_below_the_threshold_keeps_running(make_run):
    # Half the episodes fail: with breaker_failure_rate=1.0 the run goes on and trains.
    flip = iter(range(10**6))

    class HalfBroken(EchoEnv):
        async def _reset(self, task):
            if next(flip) % 2:
                raise RuntimeError("flaky")
            return await super()._reset(task)

    run = make_run(HalfBroken)
    result = run.pipeline(group_size=1).run(2)
    assert len(result.steps) == 2 and result.accounting.num_failed > 0


def test_dead_engine_stops_the_run(make_run):
    run = make_run(EchoEnv)

    def broken_decode(*args, **kwargs):
        raise ValueError("unknown activation 'foo'")

    run.engine._decode = broken_decode  # the step thread dies at its first decode
    error = _stopped(run.pipeline(), "engine_died")
    assert "unknown activation 'foo'" in str(error)


def test_model_calls_that_always_time_out_stop_the_run(make_run):
    run = make_run(EchoEnv, model_timeout_s=0.2)
    run.engine.pause()  # requests queue and never run: every model call times out
    error = _stopped(run.pipeline(), "failures")
    assert "timeout (model_timeout)" in str(error) and "to change: collector.model_timeout_s" in str(error)


def test_prompts_longer_than_the_episode_budget_stop_the_run(make_run):
    # Every first prompt (~25 tokens) fills a 10-token budget: no model call, nothing trained.
    run = make_run(EchoEnv, max_episode_tokens=10)
    error = _stopped(run.pipeline(), "failures")
    assert "model_error (prompt_too_long)" in str(error)
    assert "collector.max_episode_tokens=10" in str(error)
    assert "to change: collector.max_episode_tokens" in str(error)


def test_negative_timeouts_are_rejected():
    with pytest.raises(ValueError, match="collector.model_timeout_s must be a positive"):
        CollectorConfig(model_timeout_s=-1)
    with pytest.raises(ValueError, match="pipeline.stall_timeout_s"):
        PipelineConfig(stall_timeout_s=0)
    with pytest.raises(ValueError, match="pipeline.mode"):
        PipelineConfig(mode="foo")


class SwallowsCancel(EchoEnv):
    """A reset that ignores its timeout by swallowing CancelledError (no model call needed,
    so the short stall bound below never measures a compilation)."""

    reset_timeout_s = 0.2

    async def _reset(self, task):
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue


def test_a_stall_names_what_the_episodes_wait_in(make_run):
    run = make_run(SwallowsCancel)
    error = _stopped(run.pipeline(stall_timeout_s=2.0), "stalled")
    assert "no group reached the trainer for 2 s" in str(error)
    assert "SwallowsCancel.reset" in str(error) and "pipeline.stall_timeout_s" in str(error)


class SleepsOnTheLoop(EchoEnv):
    async def _reset(self, task):
        time.sleep(1.5)  # a blocking call inside an async method: freezes the event loop
        return await super()._reset(task)


def test_loop_watchdog_names_the_blocking_environment(make_run):
    run = make_run(SleepsOnTheLoop)
    error = _stopped(run.pipeline(loop_block_limit_s=0.5), "loop_blocked", trains=True)
    assert "SleepsOnTheLoop.reset" in str(error) and "pipeline.loop_block_limit_s" in str(error)


def test_loop_watchdog_thread_has_ended_when_stop_returns():
    # The thread holds `on_block` (the pipeline and its device arrays). Left to end on its own,
    # it dropped them while the interpreter finalized, which aborted examples/swe_task.py at
    # exit (SIGABRT in a jax array's destructor) in 4 of 25 runs, two at a time.
    from agentax.pipeline._breaker import LoopWatchdog

    async def cycle():
        dog = LoopWatchdog(10.0, lambda error: None)
        dog.start()
        await asyncio.sleep(0)
        dog.stop()
        return dog._thread.is_alive()

    assert not any(asyncio.run(cycle()) for _ in range(20))
