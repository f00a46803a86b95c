"""RayEngineReplica: an engine in a Ray actor behind an EngineRouter, next to a local engine.

Slow (the actor imports JAX and compiles the engine on its own): marked `slow`, so the default
suite skips it and `.ci/run` runs it after the default suite.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

ray = pytest.importorskip("ray")

import scale_helpers  # noqa: E402
from agentax.records import SamplingParams  # noqa: E402
from agentax.scale import EngineRouter, RayEngineReplica  # noqa: E402
from scale_helpers import TOKENIZER, make_engine, make_model  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def build_engine():
    """Runs in the actor: the same tiny model (same seed) as the local engines."""
    return make_engine(make_model())


async def _conversations(engine):
    async def one(i):
        params = SamplingParams(temperature=1.0, max_tokens=4, seed=7 + i)
        first = await engine.generate(TOKENIZER.encode(f"c{i}:"), params)
        second = await engine.generate(TOKENIZER.encode(" go"), params, sequence_id=first.sequence_id)
        engine.release(second.sequence_id)
        return first, second

    return await asyncio.gather(*(one(i) for i in range(4)))


def test_ray_engine_replica_behind_router():
    # The actor cannot import the tests directory: ship these helpers by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(scale_helpers)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    model = make_model()
    single = make_engine(model)
    router = EngineRouter([RayEngineReplica(build_engine, num_cpus=0.5), make_engine(model)])
    try:
        want = asyncio.run(_conversations(single))
        got = asyncio.run(_conversations(router))
        assert router.stats().routed == (2, 2)
        for (wa, wb), (ga, gb) in zip(want, got):
            np.testing.assert_array_equal(wa.token_ids, ga.token_ids)
            np.testing.assert_array_equal(wb.token_ids, gb.token_ids)
        router.update_weights(jax.tree.map(lambda x: x * 0.5, nnx.state(model)), 1)
        assert router.wait_published(60.0)
        remote = router.replicas[0]
        assert isinstance(remote, RayEngineReplica) and remote.wait_published(60.0)
        assert remote.policy_version == 1  # swapped in, not only queued
        after = asyncio.run(_conversations(router))
        assert router.policy_version == 1
        assert all(int(c.versions.min()) == 1 for pair in after for c in pair)

        # A later router over the replica, which has answered calls and the first router's
        # probes: the replica is up, so a stall before its first answer to this router is a
        # stuck replica at once (stuck_after_s), not one still starting (start_timeout_s, 600 s
        # by default).
        deadline = time.monotonic() + 30
        while not remote.up and time.monotonic() < deadline:
            time.sleep(0.05)
        assert remote.up
        later = EngineRouter([remote], stuck_after_s=1.0, probe_interval_s=0.1)
        try:
            remote.actor.__ray_call__.remote(lambda self: time.sleep(3600))  # its loop blocks
            deadline = time.monotonic() + 30
            while 0 not in later.down and time.monotonic() < deadline:
                time.sleep(0.05)
            assert later.stats().dropped[0].startswith("replica_stuck replica 0")
            assert "no answer to a health probe" in later.stats().dropped[0]
        finally:
            later.shutdown()
    finally:
        single.shutdown()
        router.shutdown()
        ray.shutdown()
