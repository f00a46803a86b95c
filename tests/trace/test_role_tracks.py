"""Per-role trace tracks, end to end: a multi-agent episode through the real `Collector` with
tracing on, read back from the file (`read_trace`): every role has its own track
`episode/<group>/<sample>/<role>` holding its model calls, the episode span names each role's
reward, and `agentax doctor`'s per-role table is computed from that file."""

from __future__ import annotations

import asyncio
from collections import Counter

from agentax.agents import ModelAgent
from agentax.agents.testing import ScriptedEngine
from agentax.envs import MultiAgentEnvironment, RoleStep
from agentax.records import Observation, SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig, FunctionPolicy, RolePolicy
from agentax.text import ByteTokenizer
from agentax.trace import Tracer, doctor, names, read_trace

TOK = ByteTokenizer()


class Table(MultiAgentEnvironment):
    """"a" speaks twice, "b" once per round of a, b, a; a earns 1, b 0.5 per reply."""

    roles = ("a", "b")

    async def _reset(self, task):
        return RoleStep(observations={"a": Observation(content="you are a")}, next_role="a")

    async def _step(self, role, action):
        turn = self.num_steps
        nxt = "b" if turn == 1 else "a"
        return RoleStep(observations={nxt: Observation(content=f"{role}: {action.text}")},
                        rewards={role: 1.0 if role == "a" else 0.5}, done=turn >= 3,
                        next_role=nxt)


def test_each_role_has_its_track_and_the_doctor_table_comes_from_the_file(tmp_path):
    collector = Collector(
        ScriptedEngine(lambda t: "hello", tokenizer=TOK), TOK, Table, ModelAgent,
        SamplingParams(max_tokens=8), CollectorConfig(max_turns=8, max_episode_tokens=512),
        roles={"a": RolePolicy(), "b": RolePolicy(engine=FunctionPolicy(lambda t: "hm", TOK),
                                                  trained=False)})
    tracer = Tracer()
    collector.tracer = tracer
    tracer.start(tmp_path)

    async def episodes():
        return [await collector.run_episode_roles(Task(id="t"), seed=s, group_id="g4",
                                                  sample_index=s) for s in range(2)]

    runs = asyncio.run(episodes())
    tracer.close()
    assert [[t.info["role"] for t in trajs] for trajs in runs] == [["a"], ["a"]]

    trace = read_trace(tmp_path)
    calls = trace.spans_named(names.MODEL_CALL)
    by_track = Counter(s.track for s in calls)
    assert by_track == {f"episode/g4/{i}/{r}": n for i in (0, 1) for r, n in (("a", 2), ("b", 1))}
    assert all(s.args[names.ARG_ROLE] == s.track.rsplit("/", 1)[1] for s in calls)
    episodes_ = trace.spans_named(names.EPISODE)
    assert sorted(s.track for s in episodes_) == ["episode/g4/0", "episode/g4/1"]

    report = doctor.analyze(tmp_path)
    assert set(report.roles) == {"a", "b"}
    assert report.roles["a"]["model_calls"] == 4 and report.roles["b"]["model_calls"] == 2
    assert report.roles["a"]["episodes"] == report.roles["b"]["episodes"] == 2
    assert report.roles["a"]["reward_mean"] == 2.0 and report.roles["b"]["reward_mean"] == 0.5
    model_s = sum(s.dur_ns for s in calls if s.args[names.ARG_ROLE] == "a") / 1e9
    assert abs(report.roles["a"]["model_s"] - model_s) < 1e-6
    text = doctor.format_report(report)
    assert "role" in text and all(f"  {r} " in text or f" {r} " in text for r in ("a", "b"))
