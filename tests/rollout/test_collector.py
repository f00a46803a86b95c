"""The collector's paths, each driven directly through `Collector.run_episode` with a
`ScriptedEngine`: the normal end, each timeout, a model error, each truncation, cancellation.
Every path must end with one typed status and release its engine sequence and environment."""

import asyncio

import pytest

from agentax.agents import ModelAgent
from agentax.agents.testing import ScriptedEngine
from agentax.engine import PromptTooLong
from agentax.envs import Environment
from agentax.records import FinishReason, Observation, SamplingParams, StepResult, Task, TrajectoryStatus
from agentax.rollout import Collector, CollectorConfig
from agentax.text import ByteTokenizer

TOK = ByteTokenizer()
TASK = Task(id="guess", answer="7")


class Guess(Environment):
    """Reward 1 and done when the reply contains the answer; otherwise "again" (never ends)."""

    def __init__(self, step_delay_s: float = 0.0) -> None:
        super().__init__()
        self.step_delay_s = step_delay_s
        self.closed = 0

    async def _reset(self, task: Task) -> Observation:
        self.answer = task.answer
        return Observation(content="Guess a digit.")

    async def _step(self, action):
        await asyncio.sleep(self.step_delay_s)
        if self.answer in action.text:
            return StepResult(observation=Observation(content="yes"), reward=1.0, done=True)
        return StepResult(observation=Observation(content="again"))

    async def _close(self) -> None:
        self.closed += 1


def collect(engine, *, env=None, max_tokens=32, **config):
    env = env or Guess()
    collector = Collector(
        engine, TOK, lambda: env, ModelAgent, SamplingParams(max_tokens=max_tokens),
        CollectorConfig(**{"max_turns": 8, "max_episode_tokens": 4096, **config}),
    )
    traj = asyncio.run(collector.run_episode(TASK, seed=0, group_id="g"))
    return traj, env


def test_episode_ends_ok_and_releases_its_sequence():
    engine = ScriptedEngine(["3", "5", "7"], tokenizer=TOK)
    traj, env = collect(engine)
    assert traj.status is TrajectoryStatus.OK and traj.reward == 1.0
    assert traj.info["turns"] == 3 and traj.info["reason"] == "done"
    assert engine.live_sequences == set() and len(engine.released) == 1 and env.closed == 1
    # the sequence was continued: only the first call started one
    assert [t.completion.sequence_id for t in traj.turns] == [engine.released[0]] * 3
    assert traj.num_generated == sum(len(r) + 1 for r in ("3", "5", "7"))  # + eos each


def test_model_timeout():
    engine = ScriptedEngine(["7"], tokenizer=TOK, delay_s=5.0)
    traj, env = collect(engine, model_timeout_s=0.1)
    assert traj.status is TrajectoryStatus.TIMEOUT
    assert traj.info["reason"] == "model_timeout"
    assert engine.live_sequences == set() and env.closed == 1


def test_model_timeout_on_a_later_turn_releases_the_open_sequence():
    engine = ScriptedEngine(["1", "2"], tokenizer=TOK)
    collector_env = Guess()

    async def run():
        collector = Collector(engine, TOK, lambda: collector_env, ModelAgent, SamplingParams(max_tokens=16),
                              CollectorConfig(model_timeout_s=0.2, max_episode_tokens=4096))
        orig = engine.generate

        async def slow_second(prompt_ids, params, *, sequence_id=None):
            if sequence_id is not None:
                await asyncio.sleep(5.0)
            return await orig(prompt_ids, params, sequence_id=sequence_id)

        engine.generate = slow_second
        return await collector.run_episode(TASK, seed=0)

    traj = asyncio.run(run())
    assert traj.status is TrajectoryStatus.TIMEOUT and traj.info["reason"] == "model_timeout"
    assert engine.live_sequences == set() and engine.released and collector_env.closed == 1


def test_episode_timeout():
    engine = ScriptedEngine(lambda text: "1", tokenizer=TOK, delay_s=0.05)
    traj, env = collect(engine, env=Guess(step_delay_s=0.05), max_turns=1000, episode_timeout_s=0.5)
    assert traj.status is TrajectoryStatus.TIMEOUT and traj.info["reason"] == "episode_timeout"
    assert traj.info["turns"] >= 1
    assert engine.live_sequences == set() and env.closed == 1


def test_model_error_is_a_status_with_the_message():
    engine = ScriptedEngine(["1", RuntimeError("device lost")], tokenizer=TOK)
    traj, env = collect(engine)
    assert traj.status is TrajectoryStatus.MODEL_ERROR
    assert traj.info["reason"] == "RuntimeError" and "device lost" in traj.info["error"]
    assert traj.info["turns"] == 1
    assert engine.live_sequences == set() and env.closed == 1


def test_context_full_truncates():
    engine = ScriptedEngine(["1", ("2", FinishReason.SLOT_FULL)], tokenizer=TOK)
    traj, env = collect(engine)
    assert traj.status is TrajectoryStatus.TRUNCATED and traj.info["reason"] == "context_full"
    assert traj.info["turns"] == 2 and engine.live_sequences == set()


@pytest.mark.parametrize("limit", ["max_turns", "max_episode_tokens"])
def test_episode_limit_truncates(limit):
    engine = ScriptedEngine(lambda text: "1", tokenizer=TOK)
    config = {"max_turns": 3} if limit == "max_turns" else {"max_turns": 1000, "max_episode_tokens": 400}
    traj, env = collect(engine, **config)
    assert traj.status is TrajectoryStatus.TRUNCATED
    assert traj.info["reason"] == ("max_turns=3" if limit == "max_turns" else "max_episode_tokens=400")
    if limit == "max_turns":
        assert traj.info["turns"] == 3
    else:
        assert traj.num_tokens <= 400 + 32  # the last call is cut to the budget
    assert engine.live_sequences == set() and env.closed == 1


def test_cancel_releases_the_sequence_and_closes_the_environment():
    engine = ScriptedEngine(["1", "2", "3"], tokenizer=TOK)
    env = Guess()
    started = asyncio.Event()

    async def run():
        orig = engine.generate

        async def hang_on_second(prompt_ids, params, *, sequence_id=None):
            if sequence_id is not None:
                started.set()
                await asyncio.sleep(60)
            return await orig(prompt_ids, params, sequence_id=sequence_id)

        engine.generate = hang_on_second
        collector = Collector(engine, TOK, lambda: env, ModelAgent, SamplingParams(max_tokens=16),
                              CollectorConfig(max_episode_tokens=4096))
        task = asyncio.create_task(collector.run_episode(TASK, seed=0))
        await started.wait()
        assert engine.live_sequences  # the episode holds a sequence while it waits
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert engine.live_sequences == set() and len(engine.released) == 1 and env.closed == 1


def test_scripted_engine_refuses_a_released_sequence():
    engine = ScriptedEngine(["a", "b"], tokenizer=TOK)

    async def run():
        c = await engine.generate([1, 2], SamplingParams(max_tokens=8))
        engine.release(c.sequence_id)
        with pytest.raises(KeyError, match="not live"):
            await engine.generate([3], SamplingParams(max_tokens=8), sequence_id=c.sequence_id)
        cut = await ScriptedEngine(["abcdef"], tokenizer=TOK).generate([1], SamplingParams(max_tokens=3))
        return cut

    cut = asyncio.run(run())
    assert cut.num_tokens == 3 and cut.finish_reason is FinishReason.LENGTH


def test_a_first_prompt_over_the_budget_is_an_error_not_a_truncation():
    """An episode whose prompt alone fills max_episode_tokens never calls the model: it must not
    reach the trainer as an empty "truncated" trajectory, and the message says what to raise."""
    engine = ScriptedEngine(["7"], tokenizer=TOK)
    traj, env = collect(engine, max_episode_tokens=20)
    assert traj.status is TrajectoryStatus.MODEL_ERROR and traj.info["reason"] == "prompt_too_long"
    assert "max_episode_tokens=20" in traj.info["error"] and traj.num_generated == 0
    assert traj.info["turns"] == 0 and engine.live_sequences == set() and env.closed == 1
    # One position left: one reply token, then the budget runs out (a truncation, trainable).
    budget = traj.num_tokens + 1
    traj, _ = collect(ScriptedEngine(["3"], tokenizer=TOK), max_episode_tokens=budget)
    assert traj.status is TrajectoryStatus.TRUNCATED
    assert traj.info["reason"] == f"max_episode_tokens={budget}"
    assert traj.info["turns"] == 1 and traj.num_generated == 1


def test_an_engine_slot_too_small_fails_a_first_prompt_and_truncates_a_later_one():
    """The engine's own PromptTooLong (its slot, not the episode budget, is full): before any
    reply nothing can train (model_error, prompt_too_long, with the engine's message); after a
    reply the earlier turns train (truncated, context_full). Both release their sequence."""
    full = PromptTooLong("prompt of 40 tokens leaves no room in a slot of max_seq_len=32")
    traj, env = collect(ScriptedEngine([full], tokenizer=TOK))
    assert traj.status is TrajectoryStatus.MODEL_ERROR and traj.info["reason"] == "prompt_too_long"
    assert "max_seq_len=32" in traj.info["error"] and traj.num_generated == 0 and env.closed == 1
    engine = ScriptedEngine(["1", full], tokenizer=TOK)
    traj, env = collect(engine)
    assert traj.status is TrajectoryStatus.TRUNCATED and traj.info["reason"] == "context_full"
    assert traj.info["turns"] == 1 and traj.num_generated == 2 and engine.live_sequences == set()


def test_most_episodes_cut_by_a_budget_warn_once_with_the_knob(caplog, monkeypatch):
    """A budget too small for the task (every episode cut after one reply) trains on nothing but
    cut episodes: the run says so once, with the limit, the turns, the prompt and the knob;
    episodes cut by the environment's own step limit are the task's business, not a warning."""
    from agentax.rollout import _collector

    monkeypatch.setattr(_collector, "_warned_cuts", set())
    engine = ScriptedEngine(lambda text: "1", tokenizer=TOK)
    collector = Collector(engine, TOK, Guess, ModelAgent, SamplingParams(max_tokens=8),
                          CollectorConfig(max_turns=100, max_episode_tokens=40))

    async def run(n):
        return [await collector.run_episode(TASK, seed=i) for i in range(n)]

    with caplog.at_level("WARNING", logger="agentax.rollout._collector"):
        trajs = asyncio.run(run(63))
        assert all(t.info["reason"] == "max_episode_tokens=40" for t in trajs) and not caplog.records
        asyncio.run(run(70))
    (warning,) = caplog.records
    prompt = trajs[0].turns[0].prompt_ids.size
    assert ("64 of the last 64 episodes were cut short (max_episode_tokens=40) after 1.0 model "
            f"calls on average (first prompt {prompt} tokens): raise collector.max_episode_tokens"
            ) in warning.getMessage()


def test_episodes_the_environment_ends_do_not_warn(caplog, monkeypatch):
    from agentax.rollout import _collector

    class Short(Guess):
        max_steps = 1

    monkeypatch.setattr(_collector, "_warned_cuts", set())
    collector = Collector(ScriptedEngine(lambda text: "1", tokenizer=TOK), TOK, Short, ModelAgent,
                          SamplingParams(max_tokens=8), CollectorConfig(max_episode_tokens=4096))

    async def run():
        return [await collector.run_episode(TASK, seed=i) for i in range(64)]

    with caplog.at_level("WARNING", logger="agentax.rollout._collector"):
        trajs = asyncio.run(run())
    assert {t.info["reason"] for t in trajs} == {"env_truncated"} and not caplog.records
