"""The multi-agent episode loop, driven through the real `Collector` with scripted models:
turn order, per-role observations and rewards, per-role token streams, a role that times out,
a role whose model call fails, a fixed role that never trains, and per-(task, role) groups in
the pipeline with balanced books."""

import asyncio

import pytest

from agentax.agents import ModelAgent
from agentax.agents.testing import ScriptedEngine
from agentax.envs import EnvError, MultiAgentEnvironment, RoleStep
from agentax.pipeline import split_roles
from agentax.records import Group, Observation, SamplingParams, Task, TrajectoryStatus
from agentax.rollout import Collector, CollectorConfig, FunctionPolicy, RolePolicy
from agentax.text import ByteTokenizer

TOK = ByteTokenizer()
TASK = Task(id="count", answer="3")


class Relay(MultiAgentEnvironment):
    """"a" and "b" take turns saying a word; after `rounds` turns each, every role earns its
    number of replies that contain "ok" (a: +1 each, b: +2 each). Records the turn order."""

    roles = ("a", "b")

    def __init__(self, rounds: int = 2) -> None:
        super().__init__()
        self.rounds = rounds
        self.order: list[tuple[str, str]] = []
        self.closed = 0

    async def _reset(self, task):
        self.order = []
        return RoleStep(observations={"a": Observation(content="you are a")}, next_role="a")

    async def _step(self, role, action):
        self.order.append((role, action.text))
        other = "b" if role == "a" else "a"
        reward = {"a": 1.0, "b": 2.0}[role] * ("ok" in action.text)
        done = len(self.order) >= 2 * self.rounds
        return RoleStep(observations={other: Observation(content=f"{role} said {action.text}")},
                        rewards={role: reward}, done=done, next_role=other)

    async def _close(self):
        self.closed += 1


def by_role(fn_a, fn_b):
    """A scripted engine whose reply depends on which role's stream it continues."""
    def reply(text: str):
        return fn_a(text) if "you are a" in text else fn_b(text)
    return reply


def run(engine, env, *, roles=None, **config):
    collector = Collector(engine, TOK, lambda: env, ModelAgent, SamplingParams(max_tokens=16),
                          CollectorConfig(**{"max_turns": 16, "max_episode_tokens": 4096, **config}),
                          roles=roles)
    return asyncio.run(collector.run_episode_roles(TASK, seed=0, group_id="g7", sample_index=1))


def test_turns_alternate_and_each_role_gets_its_own_stream_and_rewards():
    engine = ScriptedEngine(by_role(lambda t: "ok-a", lambda t: "ok-b"), tokenizer=TOK)
    env = Relay(rounds=2)
    trajs = run(engine, env)
    assert [r for r, _ in env.order] == ["a", "b", "a", "b"]
    a, b = trajs
    assert (a.info["role"], b.info["role"]) == ("a", "b")
    assert a.status is b.status is TrajectoryStatus.OK
    assert (a.reward, b.reward) == (2.0, 4.0)
    assert a.info["turns"] == b.info["turns"] == 2 and a.info["episode_turns"] == 4
    # Each role's stream holds its own replies (mask 1) and what it saw (mask 0), nothing else.
    text_a = TOK.decode(a.token_ids.tolist(), skip_special_tokens=False)
    text_b = TOK.decode(b.token_ids.tolist(), skip_special_tokens=False)
    assert "ok-a" in text_a and "ok-b" not in TOK.decode(a.token_ids[a.loss_mask > 0].tolist())
    assert "b said ok-b" in text_a and "a said ok-a" in text_b and "you are a" not in text_b
    assert TOK.decode(b.token_ids[b.loss_mask > 0].tolist()).count("ok-b") == 2
    # one engine sequence per role, continued across its turns, all released
    assert len({t.completion.sequence_id for t in a.turns}) == 1
    assert a.turns[0].completion.sequence_id != b.turns[0].completion.sequence_id
    assert engine.live_sequences == set() and len(engine.released) == 2 and env.closed == 1
    assert a.group_id == b.group_id == "g7" and a.sample_index == b.sample_index == 1


def test_a_role_that_times_out_ends_the_episode_and_is_named():
    async def slow_b(text):
        await asyncio.sleep(5)
        return "late"

    class SlowEngine(ScriptedEngine):
        async def generate(self, prompt_ids, params, *, sequence_id=None):
            text = TOK.decode(list(prompt_ids), skip_special_tokens=False)
            if "a said" in text and sequence_id is None:  # b's first call
                await asyncio.sleep(5)
            return await super().generate(prompt_ids, params, sequence_id=sequence_id)

    engine = SlowEngine(by_role(lambda t: "ok", lambda t: "ok"), tokenizer=TOK)
    env = Relay()
    trajs = run(engine, env, model_timeout_s=0.2)
    assert [t.status for t in trajs] == [TrajectoryStatus.TIMEOUT] * 2
    assert {t.info["failed_role"] for t in trajs} == {"b"}
    assert trajs[0].info["reason"] == "model_timeout"
    assert [r for r, _ in env.order] == ["a"]
    assert engine.live_sequences == set() and env.closed == 1


def test_a_role_whose_model_call_fails_is_a_model_error_of_the_episode():
    engine = ScriptedEngine(by_role(lambda t: "ok", lambda t: RuntimeError("b's model broke")),
                            tokenizer=TOK)
    env = Relay()
    trajs = run(engine, env)
    assert {t.status for t in trajs} == {TrajectoryStatus.MODEL_ERROR}
    assert trajs[0].info["failed_role"] == "b" and "b's model broke" in trajs[0].info["error"]
    # a's sequence is released; b's failed call never returned one (ScriptedEngine keeps it)
    assert engine.released == [trajs[0].turns[0].completion.sequence_id] and env.closed == 1


def test_a_fixed_role_plays_through_the_same_loop_and_is_not_returned():
    engine = ScriptedEngine(lambda t: "ok", tokenizer=TOK)
    seen = []
    fixed = FunctionPolicy(lambda text: seen.append(text) or "no", TOK)
    env = Relay(rounds=3)
    trajs = run(engine, env, roles={"a": RolePolicy(), "b": RolePolicy(engine=fixed, trained=False)})
    assert [t.info["role"] for t in trajs] == ["a"]
    assert [text for r, text in env.order if r == "b"] == ["no"] * 3
    assert trajs[0].reward == 3.0 and fixed.calls == 3 and engine.calls == 3
    assert "a said ok" in seen[-1] and engine.live_sequences == set() and not fixed._sequences


def test_a_bad_next_role_is_an_env_error():
    class Bad(Relay):
        async def _step(self, role, action):
            return RoleStep(observations={}, next_role="b")

    trajs = run(ScriptedEngine(lambda t: "ok", tokenizer=TOK), Bad())
    assert trajs[0].status is TrajectoryStatus.ENV_ERROR
    assert "got no observation" in trajs[0].info["error"]


def test_roles_without_a_policy_and_policies_that_cannot_train_are_refused():
    with pytest.raises(ValueError, match="no role"):
        Collector(None, TOK, Relay, ModelAgent, SamplingParams(),
                  roles={"a": RolePolicy(engine=FunctionPolicy(str, TOK), trained=False)})
    with pytest.raises(ValueError, match="engine=None"):
        RolePolicy(engine=FunctionPolicy(str, TOK), trained=True)
    trajs = run(ScriptedEngine(lambda t: "ok", tokenizer=TOK), Relay(), roles={"a": RolePolicy()})
    assert trajs[0].status is TrajectoryStatus.MODEL_ERROR and "'b' has no policy" in trajs[0].info["error"]


def test_env_base_checks_roles_and_rewards():
    class Loose(Relay):
        async def _step(self, role, action):
            return RoleStep(observations={"c": Observation()}, next_role="c")

    async def go():
        env = Loose()
        await env.reset(TASK)
        from agentax.records import Action
        with pytest.raises(EnvError, match="unknown role 'c'"):
            await env.step("a", Action(text="x"))
    asyncio.run(go())


def test_groups_split_per_role():
    engine = ScriptedEngine(by_role(lambda t: "ok", lambda t: "no"), tokenizer=TOK)
    trajs = [t for _ in range(2) for t in run(engine, Relay())]
    parts = split_roles(Group(group_id="g3", task_id="count", trajectories=tuple(trajs)))
    assert [p.group_id for p in parts] == ["g3/a", "g3/b"]
    assert [len(p.trajectories) for p in parts] == [2, 2]
    assert {t.info["role"] for t in parts[1].trajectories} == {"b"}
