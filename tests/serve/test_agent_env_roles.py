"""Several OpenAI-SDK agents in one episode (`OpenAIAgentEnvironment(roles=...)`) through the
real `Collector` and endpoint: each role's client has a base URL of its own, so its calls land
in its own trajectory and trace track, and the trained roles form per-(task, role) groups as
native ones do."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agentax.agents import ModelAgent
from agentax.pipeline import split_roles
from agentax.records import Group, SamplingParams, Task, TrajectoryStatus
from agentax.rollout import Collector, CollectorConfig
from agentax.serve import OpenAIAgentEnvironment, Reward
from agentax.trace import get_tracer, names

TASK = Task(id="t1", prompt="What is 2+2?", answer="4")
CFG = CollectorConfig(max_turns=4, max_episode_tokens=400, model_timeout_s=300, episode_timeout_s=600)


async def solver_verifier(clients, task):
    """The solver answers, the verifier judges the answer: two SDK clients, one per role."""
    solved = await clients["solver"].chat.completions.create(
        model="agentax", messages=[{"role": "user", "content": task.prompt}])
    answer = solved.choices[0].message.content
    await clients["verifier"].chat.completions.create(
        model="agentax", messages=[{"role": "user", "content": f"Is '{answer}' right?"}])
    return {"solver": Reward(1.0), "verifier": Reward(0.25)}


def run(recording, tok, env_factory, sample_index=0):
    col = Collector(recording, tok, env_factory, ModelAgent, SamplingParams(max_tokens=8), CFG)
    return asyncio.run(col.run_episode_roles(TASK, seed=5, group_id="g", sample_index=sample_index))


def test_each_roles_calls_land_in_its_own_trajectory(recording, tok):
    make = lambda: OpenAIAgentEnvironment(solver_verifier, roles=("solver", "verifier"))  # noqa: E731
    tracer = get_tracer()
    tracer.take_events()
    trajs = run(recording, tok, make)
    # each role's calls on its own track under the episode's, with its role (as native roles)
    calls = [(e[3], e[5].get(names.ARG_ROLE)) for e in tracer.take_events()
             if e[0] == 0 and e[4] == names.MODEL_CALL]
    assert sorted(calls) == [("episode/g/0/solver", "solver"), ("episode/g/0/verifier", "verifier")]
    solver, verifier = trajs
    assert [t.info["role"] for t in trajs] == ["solver", "verifier"]
    assert all(t.status is TrajectoryStatus.OK for t in trajs), [t.info for t in trajs]
    assert (solver.reward, verifier.reward) == (1.0, 0.25)
    assert solver.info["roles"] == ["solver", "verifier"] and solver.info["episode_turns"] == 2
    (p1, s1, c1), (p2, s2, c2) = recording.calls
    assert s1 is None and s2 is None  # a fresh engine sequence per role
    np.testing.assert_array_equal(solver.token_ids, np.concatenate([p1, c1.token_ids]))
    np.testing.assert_array_equal(verifier.token_ids, np.concatenate([p2, c2.token_ids]))
    assert "Is '" in tok.decode(verifier.token_ids.tolist()) and "Is '" not in tok.decode(
        solver.token_ids.tolist())
    assert solver.info["flow_id"] == verifier.info["flow_id"]  # one episode
    # two episodes of the task: per-(task, role) groups, as the native multi-agent path
    more = run(recording, tok, make, sample_index=1)
    parts = split_roles(Group(group_id="g", task_id=TASK.id, trajectories=(*trajs, *more)))
    assert [p.group_id for p in parts] == ["g/solver", "g/verifier"]
    assert [[t.sample_index for t in p.trajectories] for p in parts] == [[0, 1], [0, 1]]


def test_untrained_roles_play_but_do_not_train(recording, tok):
    trajs = run(recording, tok, lambda: OpenAIAgentEnvironment(
        solver_verifier, roles=("solver", "verifier"), trained_roles=("solver",)))
    assert [t.info["role"] for t in trajs] == ["solver"] and len(recording.calls) == 2
    with pytest.raises(ValueError, match="trained_roles"):
        OpenAIAgentEnvironment(solver_verifier, roles=("a",), trained_roles=("b",))
    with pytest.raises(ValueError, match="distinct"):
        OpenAIAgentEnvironment(solver_verifier, roles=("a", "a"))
