"""EngineRouter over real engines: same tokens as one engine, affinity, load, versions, failures."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from agentax.engine import EngineError, SequenceError
from agentax.records import SamplingParams, Task, TrajectoryStatus
from agentax.scale import EngineRouter
from agentax.scale.testing import SleepyEnv
from scale_helpers import ENGINE_CONFIG, TOKENIZER, make_collector, make_engine, make_model, run_episodes
from tests.compile_flags import fast_compile_xla_flags

PROMPTS = [TOKENIZER.encode(f"conversation {i}:") for i in range(4)]
FOLLOW_UP = TOKENIZER.encode(" and then?")


async def _two_turns(engine, release=True):
    """Four concurrent two-turn conversations; returns completions per conversation."""

    async def one(i):
        params = SamplingParams(temperature=1.0, max_tokens=5, seed=100 + i)
        first = await engine.generate(PROMPTS[i], params)
        second = await engine.generate(FOLLOW_UP, params, sequence_id=first.sequence_id)
        return first, second

    out = await asyncio.gather(*(one(i) for i in range(4)))
    if release:
        for _, second in out:
            engine.release(second.sequence_id)
    return out


@pytest.fixture(scope="module")
def model():
    return make_model()


def test_router_gives_the_tokens_of_one_engine_and_keeps_conversations_on_their_replica(model):
    single = make_engine(model)
    router = EngineRouter([make_engine(model), make_engine(model)])
    try:
        want = asyncio.run(_two_turns(single))

        async def routed():
            out = await _two_turns(router, release=False)
            homes = [(router.replica_of(a.sequence_id), router.replica_of(b.sequence_id)) for a, b in out]
            live = router.stats().live_sequences
            for _, second in out:
                router.release(second.sequence_id)
            return out, homes, live

        got, homes, live = asyncio.run(routed())
        stats = router.stats()
    finally:
        single.shutdown()
        router.shutdown()
    for (wa, wb), (ga, gb) in zip(want, got):
        np.testing.assert_array_equal(wa.token_ids, ga.token_ids)
        np.testing.assert_array_equal(wb.token_ids, gb.token_ids)
        np.testing.assert_allclose(wb.logprobs, gb.logprobs, rtol=1e-5, atol=1e-5)
        assert ga.sequence_id == gb.sequence_id  # the router's id survives the continuation
    assert len({a.sequence_id for a, _ in got}) == 4  # ids unique across replicas
    assert all(h1 == h2 is not None for h1, h2 in homes)
    # Least-loaded placement: four concurrent conversations split two and two.
    assert stats.routed == (2, 2) and live == (2, 2)
    assert stats.live_sequences == (0, 0) and stats.continuations == 4
    # Affinity: the replicas prefilled exactly the new tokens (plus, on a continuation, the
    # previous turn's last sampled token, which decode never fed), never a history.
    prefilled = sum(s.prefill_tokens for s in stats.replicas)
    assert prefilled == sum(len(p) for p in PROMPTS) + 4 * (len(FOLLOW_UP) + 1)


def test_publish_reaches_every_replica_and_version_is_the_minimum(model):
    behind, ahead = make_engine(model, policy_version=2), make_engine(model, policy_version=3)
    router = EngineRouter([behind, ahead])
    try:
        assert router.policy_version == 2  # the oldest weights still in use
        new_state = jax.tree.map(lambda x: x * 0.5, nnx.state(model))
        router.update_weights(new_state, 7)
        with pytest.raises(ValueError, match="backwards"):
            router.update_weights(new_state, 6)
        out = asyncio.run(_two_turns(router))
        assert router.policy_version == 7 and router.published_version == 7
        assert all(int(c.versions.min()) == 7 for pair in out for c in pair)
    finally:
        router.shutdown()


def test_unknown_sequence_and_a_dead_replica_whose_requests_rerun_elsewhere(model):
    a, b = make_engine(model), make_engine(model)
    router = EngineRouter([a, b])
    try:
        async def go():
            with pytest.raises(SequenceError):
                await router.generate(PROMPTS[0], SamplingParams(max_tokens=2), sequence_id=12345)
            parked = await router.generate(PROMPTS[1], SamplingParams(max_tokens=2))  # on replica 0
            a.shutdown()
            # The next new conversation lands on replica 0, fails there, re-runs on replica 1.
            moved = await router.generate(PROMPTS[0], SamplingParams(max_tokens=2))
            later = [await router.generate(p, SamplingParams(max_tokens=2)) for p in PROMPTS]
            # A conversation parked on the dead replica continues on replica 1 (history prefilled).
            cont = await router.generate(FOLLOW_UP, SamplingParams(max_tokens=2),
                                         sequence_id=parked.sequence_id)
            return parked, moved, later, cont

        parked, moved, later, cont = asyncio.run(go())
        stats = router.stats()
        assert stats.down == (0,) and stats.replicas[0] is None
        assert stats.reruns == {"engine_error": 1} and stats.moved == {"engine_error": 1}
        assert "engine_error replica 0" in stats.dropped[0] and "in generate" in stats.dropped[0]
        assert {router.replica_of(c.sequence_id) for c in [moved, *later, cont]} == {1}
        assert stats.live_sequences == (0, 6)
        assert cont.prompt_len == len(FOLLOW_UP)
        # Replica 1 prefilled the parked conversation's whole history.
        history = len(PROMPTS[1]) + parked.num_tokens + len(FOLLOW_UP)
        assert stats.replicas[1].prefill_tokens >= history
        b.shutdown()
        with pytest.raises(EngineError, match="all 2 engine replicas are down: .*replica 1"):
            asyncio.run(router.generate(PROMPTS[0], SamplingParams(max_tokens=2)))
    finally:
        router.shutdown()


def test_collector_over_router_multi_turn(model):
    # Prefix sharing off: the prefill count below is exact only when no page is shared.
    config = dataclasses.replace(ENGINE_CONFIG, prefix_sharing=False)
    router = EngineRouter([make_engine(model, config), make_engine(model, config)])
    try:
        collector = make_collector(router, functools.partial(SleepyEnv, num_steps=3), max_turns=3)
        trajs = run_episodes(collector, [Task(id=f"t{i}", prompt="hi") for i in range(6)], concurrency=6)
        stats = router.stats()
    finally:
        router.shutdown()
    assert all(t.status is TrajectoryStatus.OK and len(t.turns) == 3 for t in trajs)
    assert stats.routed == (3, 3) and stats.live_sequences == (0, 0)
    assert stats.continuations == 6 * 2
    # No history was re-prefilled: prefill == non-generated tokens + 1 per continuation.
    prompt_tokens = sum(int((t.loss_mask == 0).sum()) for t in trajs)
    assert sum(s.prefill_tokens for s in stats.replicas) == prompt_tokens + stats.continuations


_DEVICES_CHECK = textwrap.dedent(
    """
    import asyncio, jax, numpy as np
    from flax import nnx
    from agentax.records import SamplingParams
    from agentax.scale import EngineRouter
    from scale_helpers import TOKENIZER, make_engine, make_model

    assert jax.device_count() == 4, jax.devices()
    model = make_model()
    router = EngineRouter.on_devices(model, make_engine, 2)
    engines = router.replicas
    homes = [{d for leaf in jax.tree.leaves(e._weights) for d in leaf.devices()} for e in engines]
    assert homes == [{jax.devices()[0]}, {jax.devices()[2]}], homes

    async def go():
        ps = [SamplingParams(max_tokens=4, seed=i) for i in range(4)]
        first = await asyncio.gather(*(router.generate(TOKENIZER.encode(f"p{i}"), p)
                                      for i, p in enumerate(ps)))
        router.update_weights(jax.tree.map(lambda x: x * 0.5, nnx.state(model)), 1)
        more = TOKENIZER.encode("more")
        second = await asyncio.gather(*(router.generate(more, p, sequence_id=c.sequence_id)
                                       for c, p in zip(first, ps)))
        return first, second

    first, second = asyncio.run(go())
    stats = router.stats()
    assert stats.routed == (2, 2), stats.routed
    homes_of = lambda cs: [router.replica_of(c.sequence_id) for c in cs]  # noqa: E731
    assert homes_of(first) == homes_of(second)
    # Published weights were placed on each replica's own device.
    homes = [{d for leaf in jax.tree.leaves(e._weights) for d in leaf.devices()} for e in engines]
    assert homes == [{jax.devices()[0]}, {jax.devices()[2]}], homes
    assert router.policy_version == 1 and all(int(c.versions.min()) == 1 for c in second)
    router.shutdown()
    print("DEVICES_OK")
    """
)


def test_replicas_on_disjoint_devices():
    env = dict(os.environ, XLA_FLAGS=fast_compile_xla_flags("--xla_force_host_platform_device_count=4"),
               JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _DEVICES_CHECK], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "DEVICES_OK" in proc.stdout, proc.stderr[-3000:]


def test_missing_ray_says_how_to_install(monkeypatch):
    from agentax.scale import RayEnvPool
    from agentax.scale._ray import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ImportError, match=r"pip install 'agentax\[ray\]'"):
        require_ray()
    with pytest.raises(ImportError, match=r"agentax\[ray\]"):
        RayEnvPool(SleepyEnv, 1)
