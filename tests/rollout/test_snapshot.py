"""A role played by a frozen snapshot of the trained policy (`SnapshotPolicy`), on the jitted
engine: its calls sample from the snapshot's weights (the snapshot's policy version, the old
params' tokens and logprobs) while the main engine moves on, it advances at every N-th publish,
and through the collector only the trained role's trajectories come back."""

import asyncio

import numpy as np
import pytest

from agentax.agents import ModelAgent
from agentax.engine import Engine, EngineConfig
from agentax.envs import MultiAgentEnvironment, RoleStep
from agentax.records import Observation, SamplingParams, Task
from agentax.rollout import Collector, CollectorConfig, RolePolicy, SnapshotPolicy
from agentax.text import ByteTokenizer

TOK = ByteTokenizer()
CFG = EngineConfig(max_slots=2, max_seq_len=96, prefill_chunk=32)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
PROMPT = np.asarray(TOK.encode("x:1o34x6789", add_special_tokens=False), np.int32)


class FakeTrainer:
    """What `SnapshotPolicy.advance` needs of a trainer: its current weights."""

    def __init__(self, state):
        self.state = state

    def params_for_engine(self):
        return self.state


@pytest.fixture(scope="module")
def models():
    from flax import nnx

    from agentax.models import ModelConfig, Transformer

    small = ModelConfig.tiny(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=2,
                             num_kv_heads=1, head_dim=32)
    return Transformer(small, rngs=nnx.Rngs(0)), Transformer(small, rngs=nnx.Rngs(1))


def gen(engine):
    out = asyncio.run(engine.generate(PROMPT, GREEDY))
    engine.release(out.sequence_id)
    return out


def test_snapshot_samples_old_weights_and_advances_every_n_publishes(models):
    from flax import nnx

    old, new = models
    main, snap_engine = Engine(old, CFG), Engine(old, CFG)
    try:
        snapshot = SnapshotPolicy(snap_engine, every=2)
        publish = snapshot.publisher(lambda t, e, v: e.update_weights(t.params_for_engine(), v))
        before = gen(main)  # the policy of version 0
        trainer = FakeTrainer(nnx.split(new)[1])
        publish(trainer, main, 1)  # step 1: the main engine moves on, the snapshot stays
        moved, frozen = gen(main), asyncio.run(snapshot.generate(PROMPT, GREEDY))
        snapshot.release(frozen.sequence_id)
        assert set(moved.versions.tolist()) == {1} and set(frozen.versions.tolist()) == {0}
        assert snapshot.version == 0 and snapshot.advances == 0 and snapshot.calls == 1
        assert frozen.token_ids.tolist() == before.token_ids.tolist()
        np.testing.assert_allclose(frozen.logprobs, before.logprobs, atol=1e-5)
        assert not np.allclose(moved.logprobs[:1], before.logprobs[:1], atol=1e-3)

        publish(trainer, main, 2)  # step 2: the snapshot becomes the current policy
        now, advanced = gen(main), gen(snapshot)
        assert snapshot.version == 2 and snapshot.advances == 1
        assert set(advanced.versions.tolist()) == {2}
        assert advanced.token_ids.tolist() == now.token_ids.tolist()
        np.testing.assert_allclose(advanced.logprobs, now.logprobs, atol=1e-5)
        assert not snapshot.advance(trainer, 3) and snapshot.advance(trainer, 4)
    finally:
        main.shutdown()
        snap_engine.shutdown()


class Turns(MultiAgentEnvironment):
    roles = ("x", "o")

    async def _reset(self, task):
        return RoleStep(observations={"x": Observation(content="x:123456789")}, next_role="x")

    async def _step(self, role, action):
        other = "o" if role == "x" else "x"
        return RoleStep(observations={other: Observation(content=f"{role}:{action.text[:4]}")},
                        rewards={role: 1.0}, done=self.num_steps >= 4, next_role=other)


def test_the_snapshot_role_plays_through_the_collector_and_never_trains(models):
    old, new = models
    main, snap_engine = Engine(new, CFG), Engine(old, CFG, policy_version=0)
    main.update_weights(new, 3)
    try:
        snapshot = SnapshotPolicy(snap_engine, every=4)
        collector = Collector(main, TOK, Turns, ModelAgent, SamplingParams(max_tokens=4),
                              CollectorConfig(max_turns=8, max_episode_tokens=80),
                              roles={"x": RolePolicy(),
                                     "o": RolePolicy(engine=snapshot, trained=False)})
        trajs = asyncio.run(collector.run_episode_roles(Task(id="t"), seed=0, group_id="g"))
        assert [t.info["role"] for t in trajs] == ["x"]  # o's tokens are never trained on
        x = trajs[0]
        assert set(x.versions[x.loss_mask > 0].tolist()) == {3}
        assert snapshot.calls == 2 and x.info["turns"] == 2
    finally:
        main.shutdown()
        snap_engine.shutdown()


def test_snapshot_policy_checks_its_arguments():
    class NoWeights:
        async def generate(self, *a, **k): ...

        def release(self, sid): ...

    with pytest.raises(TypeError, match="update_weights"):
        SnapshotPolicy(NoWeights(), every=2)
    with pytest.raises(ValueError, match="positive int"):
        SnapshotPolicy(NoWeights(), every=0)
