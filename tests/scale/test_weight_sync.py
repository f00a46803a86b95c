"""Weight publication to Ray engine replicas, and stuck replicas.

Fast: the chunk layout, the host staging (cast to the engine's dtype) and the delta test.
Slow (real local Ray, engines built in actors): a parallel publication gives every replica
exactly the trainer's weights (and a local engine's outputs), a delta publication equals a
full one, a replica that stops answering mid-run is dropped and its requests re-run and are
counted, and with no replica left the run stops with one line naming replica and stage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from agentax.scale import WeightSyncConfig
from agentax.scale._weight_sync import WeightLayout, _changed, stage_host
from scale_helpers import make_engine, make_model


def test_layout_covers_every_element_once_within_the_chunk_size():
    spec = [((3, 5), "float32"), ((7,), "bfloat16"), ((1000,), "float32"), ((2, 2), "int32")]
    layout = WeightLayout.from_spec(spec, chunk_bytes=1024)
    assert layout.total_bytes == 15 * 4 + 7 * 2 + 1000 * 4 + 4 * 4
    seen = [np.zeros(int(np.prod(s)), int) for s, _ in spec]
    for c, ranges in enumerate(layout.chunks):
        assert 0 < layout.chunk_bytes(c) <= 1024
        for leaf, a, b in ranges:
            seen[leaf][a:b] += 1
    assert all((s == 1).all() for s in seen)
    # Small leaves share the first chunk; the large one is split at element boundaries.
    assert [leaf for leaf, _, _ in layout.chunks[0]][:2] == [0, 1]
    assert sum(layout.chunk_bytes(c) for c in range(len(layout.chunks))) == layout.total_bytes


def test_stage_host_casts_to_the_engine_dtype_and_checks_shapes():
    layout = WeightLayout.from_spec([((4, 2), "bfloat16"), ((3,), "float32")], chunk_bytes=4096)
    state = {"a": jnp.arange(8, dtype=jnp.float32).reshape(4, 2) / 3, "b": jnp.ones(3)}
    host = stage_host(state, layout)
    assert host[0].dtype == ml_dtypes.bfloat16 and host[0].shape == (8,)
    np.testing.assert_array_equal(host[0], (np.arange(8, dtype=np.float32) / 3).astype(ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match="shape"):
        stage_host({"a": jnp.zeros((2, 4)), "b": jnp.ones(3)}, layout)
    with pytest.raises(ValueError, match="leaves"):
        stage_host([jnp.zeros((4, 2))], layout)


def test_changed_is_bitwise():
    a = [np.array([1.0, np.nan, 3.0], np.float32)]
    b = [a[0].copy()]
    assert not _changed(a, b, [(0, 0, 3)])  # NaN bits equal: unchanged
    b[0][2] = 4.0
    assert _changed(a, b, [(0, 0, 3)]) and not _changed(a, b, [(0, 0, 2)])


def test_a_replica_publishes_the_model_leaves_into_an_engine_holding_stacked_layers():
    """A deep model's engine holds its layers stacked (`EngineConfig.scan_layers`); the
    replica's chunked publication, full and delta, still speaks the model's flat leaves (run
    in-process: the actor's body without Ray)."""
    from agentax.engine import Engine, EngineConfig
    from agentax.models import ModelConfig, Transformer
    from agentax.records import SamplingParams
    from agentax.scale._replica import _EngineActor

    deep = ModelConfig.tiny(num_layers=6)
    model, other = (Transformer(deep, rngs=nnx.Rngs(s)) for s in (0, 1))
    actor = _EngineActor(lambda: Engine(model, EngineConfig(max_slots=2, max_seq_len=64,
                                                            prefill_chunk=16)))
    engine = actor.engine
    try:
        assert engine._runner.scanned
        leaves = [np.asarray(x) for x in jax.tree.leaves(nnx.state(other))]
        assert [shape for shape, _ in actor.weight_spec()] == [x.shape for x in leaves]

        def publish(version, which, base):
            ranges = [(i, 0, leaves[i].size) for i in which]
            parts = [leaves[i].reshape(-1) for i in which]
            got = asyncio.run(actor.receive_chunk(version, ranges, parts, base, True, 1))
            assert got == version
            engine.generate_batch([[1, 2, 3]], SamplingParams(max_tokens=2))  # swaps them in
            assert engine.policy_version == version
            for got, want in zip(engine._runner.leaves(), leaves, strict=True):
                np.testing.assert_array_equal(np.asarray(got), want)

        publish(1, range(len(leaves)), None)
        leaves[-1] = leaves[-1] + 1.0  # a layer leaf (the last layer's): a delta of one leaf
        publish(2, [len(leaves) - 1], 1)
    finally:
        engine.shutdown()


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="chunk_bytes"):
        WeightSyncConfig(chunk_bytes=10)
    with pytest.raises(ValueError, match="max_chunks_in_flight"):
        WeightSyncConfig(max_chunks_in_flight=0)


# ---------------------------------------------------------------------------- real Ray


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    import scale_helpers

    # The actors cannot import the tests directory: ship these helpers by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(scale_helpers)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def build_engine():
    """Runs in the actor: the tests' tiny model (seed 0) in a real engine."""
    return make_engine(make_model())


def _actor_weights(ray, replica) -> list[np.ndarray]:
    return ray.get(replica.actor.__ray_call__.remote(
        lambda self: [np.asarray(w) for w in self.engine._weights]), timeout=60)


def _slow_swaps(self) -> None:
    """Run in a replica's actor: its engine takes 1 s to swap in staged weights (a busy host)."""
    runner = self.engine._runner
    apply = runner.apply_staged

    def slow(on_applied):
        if runner._pending is not None:
            time.sleep(1.0)
        apply(on_applied)

    runner.apply_staged = slow


def _stall(replica) -> None:
    """Blocks the actor's event loop for an hour: it stops answering (a hung replica)."""
    replica.actor.__ray_call__.remote(lambda self: time.sleep(3600))


async def _turns(engine, n=3):
    from agentax.records import SamplingParams
    from scale_helpers import TOKENIZER

    async def one(i):
        return await engine.generate(TOKENIZER.encode(f"weights {i}:"),
                                     SamplingParams(temperature=1.0, max_tokens=4, seed=11 + i))

    return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.mark.slow
@pytest.mark.ray
def test_parallel_and_delta_publication_give_every_replica_the_trainers_weights(ray_local):
    from agentax.scale import EngineRouter, RayEngineReplica

    ray = ray_local
    model = make_model()
    replicas = [RayEngineReplica(build_engine, num_cpus=0.5) for _ in range(2)]
    config = WeightSyncConfig(chunk_bytes=64 << 10, max_chunks_in_flight=2, delta=True)
    router = EngineRouter(replicas, weight_sync=config)
    local = make_engine(model)
    try:
        full = jax.tree.map(lambda x: x * 0.5, nnx.state(model))
        router.update_weights(full, 1)
        assert router.wait_published(120)
        want = [np.asarray(x) for x in jax.tree.leaves(full)]
        for replica in replicas:
            for got, w in zip(_actor_weights(ray, replica), want):
                np.testing.assert_array_equal(got, w)
        local.update_weights(full, 1)
        expected = asyncio.run(_turns(local))
        for replica in replicas:
            for got, exp in zip(asyncio.run(_turns(replica)), expected):
                np.testing.assert_array_equal(got.token_ids, exp.token_ids)
                # Weights are bitwise equal (above); another process's XLA may round the
                # last bit of a logprob differently.
                np.testing.assert_allclose(got.logprobs, exp.logprobs, rtol=1e-5, atol=1e-6)
                assert int(got.versions.min()) == 1

        # Change one tensor: only its chunks travel, and the result equals a full publication.
        leaves, treedef = jax.tree.flatten(full)
        big = max(range(len(leaves)), key=lambda i: leaves[i].size)
        leaves[big] = leaves[big].at[0].add(1.0)
        changed = jax.tree.unflatten(treedef, leaves)
        before = router.stats().weight_sync.bytes_put
        # One replica's engine is slow to swap: a publication that reached it is one it has
        # swapped in all the same.
        ray.get(replicas[0].actor.__ray_call__.remote(_slow_swaps), timeout=60)
        router.update_weights(changed, 2)
        assert router.wait_published(120)
        stats = router.stats().weight_sync
        layout = router._sync.layout
        assert stats.delta_publications == 1 and stats.publications == 2
        assert 0 < stats.bytes_put - before < layout.total_bytes // 2
        for replica in replicas:
            for got, w in zip(_actor_weights(ray, replica), leaves):
                np.testing.assert_array_equal(got, np.asarray(w))
        local.update_weights(changed, 2)
        expected = asyncio.run(_turns(local))
        for replica in replicas:
            for got, exp in zip(asyncio.run(_turns(replica)), expected):
                np.testing.assert_array_equal(got.token_ids, exp.token_ids)

        # The serial path still works, and the next publication after it is full again.
        router.update_weights_serial(full, 3)
        router.update_weights(changed, 4)
        assert router.wait_published(120)
        assert router.stats().weight_sync.delta_publications == 1
        for got, w in zip(_actor_weights(ray, replicas[1]), leaves):
            np.testing.assert_array_equal(got, np.asarray(w))
        assert router.policy_version <= 4 and router.stats().down == ()
    finally:
        local.shutdown()
        router.shutdown()


def _hang_generate(replica) -> None:
    """Makes the actor's engine `generate` await forever while its event loop keeps answering."""

    def patch(actor):
        async def forever(*args, **kwargs):
            await asyncio.sleep(3600)

        actor.engine.generate = forever

    ray = pytest.importorskip("ray")
    ray.get(replica.actor.__ray_call__.remote(patch), timeout=60)


@pytest.mark.slow
@pytest.mark.ray
def test_stuck_replicas_are_dropped_their_requests_rerun_and_none_left_stops_the_run(ray_local):
    from agentax.engine import EngineError
    from agentax.pipeline import RunFailed
    from agentax.pipeline._breaker import FailureBreaker
    from agentax.records import Task, TrajectoryStatus
    from agentax.scale import EngineRouter, RayEngineReplica
    from agentax.scale.testing import SleepyEnv
    from scale_helpers import make_collector, run_episodes

    replicas = [RayEngineReplica(build_engine, num_cpus=0.5) for _ in range(2)]
    # The no-progress bound is long while episodes may compile new shapes (a compilation makes
    # no progress either); it is shortened below, once only a hung call is in flight.
    router = EngineRouter(replicas, stuck_after_s=3.0, no_progress_after_s=300.0,
                          probe_interval_s=0.25)
    try:
        env = functools.partial(SleepyEnv, num_steps=3, step_latency_s=0.3)
        collector = make_collector(router, env, max_turns=3)
        # Generous bounds: a loaded CI machine may compile the re-run histories' new shapes.
        collector.config = dataclasses.replace(collector.config, model_timeout_s=300,
                                               episode_timeout_s=600)
        run_episodes(collector, [Task(id=f"w{i}", prompt="hi") for i in range(4)], concurrency=4)
        assert router.stats().routed[0] > 0  # both replicas warm

        stalled_at = {}

        async def stall_mid_run():
            await asyncio.sleep(0.5)
            _stall(replicas[0])  # its event loop blocks: probes go unanswered
            stalled_at["t"] = time.monotonic()
            while 0 not in router.down:
                await asyncio.sleep(0.1)
            stalled_at["dropped"] = time.monotonic()

        tasks = [Task(id=f"t{i}", prompt="hi") for i in range(8)]
        trajs = run_episodes(collector, tasks, concurrency=8, during=stall_mid_run)
        stats = router.stats()
        # No episode lost: every one finished normally, the requests caught on replica 0 re-ran.
        assert len(trajs) == 8 and all(t.status is TrajectoryStatus.OK for t in trajs), [
            (t.status, t.info.get("reason")) for t in trajs]
        assert stats.down == (0,)
        assert sum(stats.reruns.values()) + sum(stats.moved.values()) >= 1
        assert set(stats.reruns) | set(stats.moved) == {"replica_stuck"}
        assert stats.dropped[0].startswith("replica_stuck replica 0")
        assert "no answer to a health probe" in stats.dropped[0]
        assert stalled_at["dropped"] > stalled_at["t"]

        # The last replica's generate hangs (its loop still answers): no progress drops it, and
        # the episode that waited on it fails with an EngineError the breaker turns into
        # RunFailed, one line naming both replicas and their stage.
        _hang_generate(replicas[1])
        router._watchdog.no_progress_after_s = 3.0
        traj = run_episodes(collector, [Task(id="last", prompt="hi")], concurrency=1)[0]
        assert traj.status is TrajectoryStatus.MODEL_ERROR and traj.info["reason"] == "ReplicasLost"
        stop = FailureBreaker(64, 1.0).record(traj)
        assert isinstance(stop, RunFailed) and stop.cause == "engine_died"
        line = str(stop)
        assert "\n" not in line and "replica 0" in line and "replica 1" in line
        assert "replica 0 (replica_stuck) in generate; replica 1 (replica_stuck) in generate (1 " \
            "requests in flight and no decode progress" in line
        with pytest.raises(EngineError):
            asyncio.run(router.generate([1, 2], None))
        with pytest.raises(RunFailed, match="no engine replica left to publish"):
            router.update_weights(nnx.state(make_model()), 1)
    finally:
        router.shutdown()


@pytest.mark.slow
@pytest.mark.ray
def test_a_replica_stuck_in_a_publication_stops_the_run_with_one_line(ray_local):
    from agentax.pipeline import RunFailed
    from agentax.scale import EngineRouter, RayEngineReplica

    replica = RayEngineReplica(build_engine, num_cpus=0.5)
    router = EngineRouter([replica], stuck_after_s=300.0,
                          weight_sync=WeightSyncConfig(background=False, chunk_timeout_s=2.0))
    try:
        state = nnx.state(make_model())
        router.update_weights(state, 1)  # up and taking weights
        _stall(replica)
        with pytest.raises(RunFailed) as failed:
            router.update_weights(state, 2)
        line = str(failed.value)
        assert "\n" not in line and "replica 0 (replica_stuck) in publish (chunk 0" in line
        assert router.stats().down == (0,)
    finally:
        router.shutdown()
