"""Roles from the outside: env.roles / eval.roles config checks and how they are built,
transcript records and `agentax show` naming each turn's role, and the doctor's per-role
table (from the trace's role arguments)."""

from __future__ import annotations

import asyncio

import pytest

from agentax.agents import ModelAgent
from agentax.agents.testing import ScriptedEngine
from agentax.run._build import build_roles
from agentax.run._sections import EnvConfig, EvalConfig
from agentax.cli._show import Filters, conversation, format_header, select
from agentax.run._transcripts import episode_record
from agentax.config import ConfigError
from agentax.envs import MultiAgentEnvironment, RoleStep
from agentax.records import Observation, SamplingParams, Task
from agentax.pipeline import PipelineConfig
from agentax.rollout import Collector, CollectorConfig, FunctionPolicy, SnapshotPolicy
from agentax.run import RunConfig
from agentax.text import ByteTokenizer
from agentax.trace import names
from agentax.trace._reader import SpanRecord, TraceData
from agentax.trace.doctor import _roles

TOK = ByteTokenizer()


def test_role_specs_are_checked_with_the_fix():
    with pytest.raises(ConfigError, match="env.roles.x='nonsense' must be 'trained'"):
        EnvConfig(roles={"x": "nonsense"})
    with pytest.raises(ConfigError, match="eval.roles trains no role"):
        EvalConfig(roles={"x": "agentax.recipes.selfplay:random_player"})
    policies = build_roles({"x": "trained", "o": "agentax.recipes.selfplay:random_player"}, TOK)
    assert policies["x"].trained and policies["x"].engine is None
    assert not policies["o"].trained and isinstance(policies["o"].engine, FunctionPolicy)
    assert build_roles({}, TOK) is None


def test_snapshot_role_specs_are_checked_and_built():
    for bad in ("snapshot:0", "snapshot:x", "snapshot:"):
        with pytest.raises(ConfigError, match=r"env.roles.o='snapshot:.*positive whole number"):
            EnvConfig(roles={"x": "trained", "o": bad})
    with pytest.raises(ConfigError, match="different periods"):
        EnvConfig(roles={"x": "trained", "o": "snapshot:2", "p": "snapshot:3"})
    with pytest.raises(ConfigError, match="trains no role"):
        EnvConfig(roles={"o": "snapshot:2"})
    with pytest.raises(ConfigError, match="publish_every=2 .* multiple of 2"):
        RunConfig(env=EnvConfig(roles={"x": "trained", "o": "snapshot:3"}),
                  pipeline=PipelineConfig(publish_every=2, max_staleness=1))
    RunConfig(env=EnvConfig(roles={"x": "trained", "o": "snapshot:4"}),
              pipeline=PipelineConfig(publish_every=2, max_staleness=1))
    snapshot = object.__new__(SnapshotPolicy)
    policies = build_roles({"x": "trained", "o": "snapshot:4"}, TOK, snapshot=snapshot)
    assert policies["o"].engine is snapshot and not policies["o"].trained
    # Without the run's snapshot (`agentax eval`): the evaluated policy itself, untrained.
    alone = build_roles({"x": "trained", "o": "snapshot:4"}, TOK)["o"]
    assert alone.engine is None and not alone.trained


class Two(MultiAgentEnvironment):
    roles = ("a", "b")

    async def _reset(self, task):
        return RoleStep(observations={"a": Observation(content="go")}, next_role="a")

    async def _step(self, role, action):
        other = "b" if role == "a" else "a"
        return RoleStep(observations={other: Observation(content=action.text)},
                        rewards={role: 1.0 if role == "a" else 0.0},
                        done=self.num_steps >= 2, next_role=other)


def test_transcripts_and_show_name_each_turns_role():
    collector = Collector(ScriptedEngine(lambda t: "hi", tokenizer=TOK), TOK, Two, ModelAgent,
                          SamplingParams(max_tokens=8), CollectorConfig(max_episode_tokens=512))
    trajs = asyncio.run(collector.run_episode_roles(Task(id="t"), seed=0, group_id="g1"))
    records = [episode_record(t, TOK, phase="train", step=1, segment=0) for t in trajs]
    assert [r["role"] for r in records] == ["a", "b"] and records[0]["roles"] == ["a", "b"]
    assert all(turn["role"] == "b" for turn in records[1]["turns"])
    assert "role b of a/b" in format_header(records[1])
    assistant = [detail for role, detail, _ in conversation(records[1]) if role == "assistant"]
    assert assistant and all(d.startswith("role b,") for d in assistant)
    assert select(records, Filters(role="a")) == [records[0]]


def test_doctor_sums_model_time_and_reward_per_role():
    def span(name, dur, **args):
        return SpanRecord(name=name, track="episode/g/0", start_ns=0, end_ns=dur, args=args)

    trace = TraceData(spans=(
        span(names.MODEL_CALL, 2_000_000_000, role="x", generated_tokens=3),
        span(names.MODEL_CALL, 1_000_000_000, role="o", generated_tokens=2),
        span(names.MODEL_CALL, 1_000_000_000, role="x", generated_tokens=1),
        span(names.EPISODE, 5, role_rewards='{"x": 1.0, "o": 0.0}'),
        span(names.EPISODE, 5, role_rewards='{"x": 0.5, "o": 0.5}'),
        span(names.MODEL_CALL, 1_000_000_000),  # a single-agent call: no role
    ), instants=(), counters={})
    rows = _roles(trace)
    assert rows["x"] == {"model_calls": 2, "model_s": 3.0, "generated_tokens": 4, "episodes": 2,
                         "reward_mean": 0.75}
    assert rows["o"]["reward_mean"] == 0.25 and rows["o"]["model_calls"] == 1


@pytest.mark.slow
def test_a_run_with_a_snapshot_role_advances_it_every_n_steps(tmp_path, monkeypatch):
    """`train` of the selfplay recipe with `o` a 'snapshot:2': o plays through the snapshot's
    own engine, which starts at version 0 and takes the trainer's weights at steps 2 and 4;
    only x trains. Slow: 31 s of CPU (two engines and the trainer compile), 193 s of wall on
    two shared cores."""
    from agentax.run import as_config, train
    from tests.cli.test_commands import TINY

    seen, calls = [], []
    advance, generate = SnapshotPolicy.advance, SnapshotPolicy.generate

    def spy_advance(self, trainer, version):
        moved = advance(self, trainer, version)
        seen.append((version, moved, self.every))
        return moved

    async def spy_generate(self, prompt_ids, params, *, sequence_id=None):
        calls.append(self.version)
        return await generate(self, prompt_ids, params, sequence_id=sequence_id)

    monkeypatch.setattr(SnapshotPolicy, "advance", spy_advance)
    monkeypatch.setattr(SnapshotPolicy, "generate", spy_generate)
    cfg = as_config("selfplay", [*TINY, "run.steps=4", "sft.steps=0", "eval.samples=0",
                                 "env.roles.o=snapshot:2", "eval.roles={}",
                                 "engine.max_slots=8", "pipeline.max_staleness=0",
                                 f"run.runs_dir={tmp_path}", "run.name=snap"])
    result = train(cfg, quiet=True)
    assert result.steps == 4
    assert [(v, m) for v, m, _ in seen] == [(1, False), (2, True), (3, False), (4, True)]
    assert calls and calls[0] == 0 and set(calls) <= {0, 2, 4}
    transcripts = (result.run_dir / "transcripts.jsonl").read_text()
    assert '"role": "x"' in transcripts and '"role": "o"' not in transcripts
