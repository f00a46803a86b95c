"""Every engine agentax ships implements `agentax.contracts.EngineClient`, member by member."""

from __future__ import annotations

import asyncio
import inspect

import numpy as np
import pytest

from agentax.agents.testing import ScriptedEngine
from agentax.contracts import (
    ENGINE_CLIENT_MEMBERS,
    EngineClient,
    EpisodeDriver,
    GenerateFn,
    check_engine_client,
)
from agentax.engine import Engine
from agentax.records import Completion, SamplingParams
from agentax.rollout import Collector, FunctionPolicy
from agentax.scale import EngineRouter, RayEngineReplica
from agentax.text import ByteTokenizer

TOK = ByteTokenizer()
IMPLEMENTATIONS = [Engine, EngineRouter, RayEngineReplica, ScriptedEngine]


def _params(fn):
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()][:4]


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_engine_has_every_member_with_the_protocols_signature(cls):
    for name in ENGINE_CLIENT_MEMBERS:
        assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
    assert isinstance(inspect.getattr_static(cls, "policy_version"), property)
    assert inspect.iscoroutinefunction(cls.generate)
    for name in ("generate", "stream"):
        want = _params(getattr(EngineClient, name))
        assert _params(getattr(cls, name)) == want, (cls.__name__, name)
        assert inspect.signature(getattr(cls, name)).parameters["params"].default is None
    assert list(inspect.signature(cls.release).parameters)[:2] == ["self", "sequence_id"]
    assert list(inspect.signature(cls.update_weights).parameters)[2] == "version"


def test_a_scripted_engine_is_a_client_that_streams_whole_and_versions_its_tokens():
    eng = ScriptedEngine(["hi", "there"], tokenizer=TOK)
    assert isinstance(eng, EngineClient) and isinstance(eng, GenerateFn)

    async def go():
        items = [x async for x in eng.stream(np.array([1, 2], np.int32))]
        eng.update_weights(None, 3)
        again = await eng.generate(np.array([3], np.int32), sequence_id=items[-1].sequence_id)
        return items, again

    items, again = asyncio.run(go())
    assert len(items) == 1 and isinstance(items[0], Completion)
    assert eng.policy_version == 3 and set(again.versions.tolist()) == {3}
    eng.release(again.sequence_id)
    eng.release(None)  # ignored, as the contract says
    assert eng.stats() == {"calls": 2, "live_sequences": 0}


def test_a_collector_given_something_else_names_what_it_lacks():
    class Half:
        async def generate(self, prompt_ids, params=None, *, sequence_id=None): ...

    class Sync:
        def generate(self, prompt_ids, params=None, *, sequence_id=None): ...

        def release(self, sequence_id): ...

    with pytest.raises(TypeError, match="Half has no release"):
        Collector(Half(), TOK, object, object, SamplingParams())
    with pytest.raises(TypeError, match="must be an async method"):
        Collector(Sync(), TOK, object, object, SamplingParams())
    with pytest.raises(TypeError, match="has no generate, release, stream"):
        check_engine_client(object(), "ChatServer")
    check_engine_client(FunctionPolicy(str, TOK), "RolePolicy.engine", ("generate", "release"))


def test_the_black_box_environment_is_the_episode_driver_the_collector_dispatches_on():
    from agentax.envs import TaskEnvironment
    from agentax.serve import OpenAIAgentEnvironment

    assert issubclass(OpenAIAgentEnvironment, EpisodeDriver)
    assert not issubclass(TaskEnvironment, EpisodeDriver)
    sig = inspect.signature(OpenAIAgentEnvironment.drive_episode)
    assert list(sig.parameters) == list(inspect.signature(EpisodeDriver.drive_episode).parameters)
