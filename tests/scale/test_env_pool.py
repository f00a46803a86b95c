"""RayEnvPool on a real local Ray cluster: same answers as local, warm reuse, faults accounted."""

from __future__ import annotations

import asyncio
import collections
import functools
import time
import os

import pytest

ray = pytest.importorskip("ray")

from flax import nnx  # noqa: E402

from agentax.envs import EnvError, ensure_async_env  # noqa: E402
from agentax.pipeline import Pipeline, PipelineConfig  # noqa: E402
from agentax.records import Action, Task, TrajectoryStatus  # noqa: E402
from agentax.scale import RayEnvPool, RemoteEnvironment  # noqa: E402
from agentax.scale.testing import SleepyEnv  # noqa: E402
from scale_helpers import make_collector, make_engine, make_model, run_episodes  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


async def _episode(env, task: Task, replies: list[str]):
    """Drives one episode through the Environment API; returns what came back."""
    out = [await env.reset(task)]
    for text in replies:
        result = await env.step(Action(text=text))
        out.append(result)
        if result.done:
            break
    await env.close()
    return out


def test_remote_matches_local_and_reuses_warm_actors():
    factory = functools.partial(SleepyEnv, num_steps=2, startup_s=0.2)
    with RayEnvPool(factory, 2, num_cpus=0.25) as pool:
        pool.warm_up()
        tasks = [Task(id=f"t{i}", prompt=f"hello {i}") for i in range(6)]
        replies = ["aaa", "xyz"]

        async def remote_run():
            return await asyncio.gather(*(_episode(pool.factory(), t, replies) for t in tasks))

        remote = asyncio.run(remote_run())
        local = [asyncio.run(_episode(ensure_async_env(factory()), t, replies)) for t in tasks]
        stats = pool.stats()

    for got, want in zip(remote, local):
        assert got[0].content == want[0].content
        assert [(r.reward, r.done, r.observation.content) for r in got[1:]] == [
            (r.reward, r.done, r.observation.content) for r in want[1:]
        ]
    assert [r.reward for r in remote[0][1:]] == [1.0, 0.0]
    # Two actors built two environments ahead, then served all six episodes between them.
    assert stats.actors_started == 2 and stats.episodes == 6 and stats.actors_replaced == 0
    pids = {ep[0].info["pid"] for ep in remote}
    assert len(pids) == 2 and os.getpid() not in pids
    assert max(ep[0].info["instance_episodes"] for ep in remote) >= 2


def test_collector_survives_killed_and_crashed_actors():
    """ray.kill on one actor mid-step and a self-crashing actor: two ENV_ERROR episodes, the
    rest OK, every started episode returned, both actors replaced."""
    factory = functools.partial(SleepyEnv, num_steps=2, step_latency_s=0.05, hang_on=("victim",),
                                crash_on=("crash",))
    pool = RayEnvPool(factory, 2, num_cpus=0.25)
    proxies: list[RemoteEnvironment] = []

    def env_factory():
        env = pool.factory()
        proxies.append(env)
        return env

    engine = make_engine(make_model())
    try:
        collector = make_collector(engine, env_factory)
        tasks = [Task(id=f"t{i}", prompt="hi") for i in range(8)]
        tasks[2] = Task(id="victim", prompt="hi")
        tasks[5] = Task(id="crash", prompt="hi")

        async def kill_victim_mid_step():
            while True:  # the victim's first step blocks inside the actor until it is killed
                victim = [e for e in proxies
                          if e.task is not None and e.task.id == "victim" and e.num_steps >= 1]
                if victim and victim[0].actor is not None:
                    await asyncio.sleep(0.1)
                    ray.kill(victim[0].actor)
                    return
                await asyncio.sleep(0.02)

        trajs = run_episodes(collector, tasks, concurrency=2, during=kill_victim_mid_step)
        stats = pool.stats()
    finally:
        engine.shutdown()
        pool.shutdown()

    assert len(trajs) == len(tasks)  # every started episode came back
    by_task = {t.task_id: t for t in trajs}
    for task_id in ("victim", "crash"):
        assert by_task[task_id].status is TrajectoryStatus.ENV_ERROR
        assert by_task[task_id].info["reason"] == "step_actor_died"
    statuses = collections.Counter(t.status for t in trajs)
    assert statuses == {TrajectoryStatus.OK: 6, TrajectoryStatus.ENV_ERROR: 2}
    assert all(t.num_generated > 0 and len(t.turns) == 2 for t in trajs if t.status is TrajectoryStatus.OK)
    assert stats.actor_deaths == 2 and stats.actors_replaced == 2
    assert stats.live_actors == 2 and stats.episodes == len(tasks)


def test_hung_actor_times_out_and_is_replaced():
    """The environment's own step limit fires inside the actor; the proxy's bound fires when
    the environment has none short enough. Either way: TIMEOUT, and the actor is replaced."""

    async def hang_once(pool):
        env = pool.factory()
        await env.reset(Task(id="hang"))
        with pytest.raises(EnvError) as err:
            await env.step(Action(text="x"))
        await env.close()
        after = await _episode(pool.factory(), Task(id="fine"), ["a", "b"])
        return err.value, after

    inner = RayEnvPool(functools.partial(SleepyEnv, step_timeout_s=0.3, hang_on=("hang",)), 1,
                       num_cpus=0.25, call_grace_s=5.0)
    outer = RayEnvPool(functools.partial(SleepyEnv, step_timeout_s=30.0, hang_on=("hang",)), 1,
                       num_cpus=0.25, step_timeout_s=0.5)
    try:
        err_inner, after_inner = asyncio.run(hang_once(inner))
        err_outer, after_outer = asyncio.run(hang_once(outer))
        s_inner, s_outer = inner.stats(), outer.stats()
    finally:
        inner.shutdown()
        outer.shutdown()
    for err in (err_inner, err_outer):
        assert err.status is TrajectoryStatus.TIMEOUT and err.kind == "timeout" and err.call == "step"
    assert s_inner.call_timeouts == 0 and s_outer.call_timeouts == 1 == s_outer.calls_abandoned
    for s, after in ((s_inner, after_inner), (s_outer, after_outer)):
        assert s.actors_replaced == 1 and s.actors_started == 2
        assert after[-1].done  # the replacement served a whole episode


def test_bad_factory_fails_episode_not_run():
    def broken():
        raise RuntimeError("no such simulator")

    pool = RayEnvPool(broken, 1, num_cpus=0.25, warm=False)

    async def go():
        with pytest.raises(EnvError) as err:
            await pool.factory().reset(Task(id="x"))
        return err.value

    try:
        err = asyncio.run(go())
        with pytest.raises(RuntimeError, match="failed to start"):
            pool.warm_up()
    finally:
        pool.shutdown()
    assert err.status is TrajectoryStatus.ENV_ERROR and err.kind == "actor_start"
    assert pool.stats().start_failures == 1


def test_a_request_no_node_can_place_fails_at_once_naming_the_resource():
    from agentax.scale import RayEngineReplica

    with pytest.raises(ValueError, match=r"RayEnvPool asks for sandbox=1 per actor, but none of the 1 live"):
        RayEnvPool(SleepyEnv, 1, num_cpus=0.25, resources={"sandbox": 1})
    with pytest.raises(ValueError, match=r"CPU=64 per actor, but the most any of the 1 live node\(s\) has is 2"):
        RayEnvPool(SleepyEnv, 1, num_cpus=64)
    with pytest.raises(ValueError, match=r"RayEngineReplica asks for GPU=1"):
        RayEngineReplica(lambda: None, num_gpus=1)
    pool = RayEnvPool(SleepyEnv, 1, num_cpus=64, warm=False, check_feasible=False)  # autoscaling
    pool.shutdown()


class RepublishTrainer:
    """A trainer that learns nothing: it records the groups it is given and republishes the
    initial weights, so the pipeline's wiring, versions and accounting run for real."""

    def __init__(self, state):
        self.state = state
        self.groups = []

    def step(self, groups):
        self.groups.extend(groups)
        return {}

    def params_for_engine(self):
        return self.state


def test_pipeline_with_remote_environments_balances_the_books():
    """The async pipeline over remote environments, one of which crashes the actor hosting it:
    the crashed group is failed and counted, the run completes, every episode is accounted."""
    model = make_model()
    engine = make_engine(model)
    pool = RayEnvPool(functools.partial(SleepyEnv, num_steps=2, crash_on=("crash",)), 2, num_cpus=0.25)
    trainer = RepublishTrainer(nnx.state(model))
    try:
        collector = make_collector(engine, pool.factory)
        tasks = lambda i: Task(id="crash" if i == 1 else f"t{i}", prompt="hi")  # noqa: E731
        config = PipelineConfig(group_size=2, groups_per_step=2, max_concurrency=4, max_staleness=1,
                                filters=())
        # Enough steps that the crashing group (admitted first) resolves before the run ends,
        # even when the actor's death takes a while to surface on a loaded machine.
        result = Pipeline(collector, trainer, engine, tasks, config).run(6)
        stats = pool.stats()
        deadline = time.time() + 30  # the last publication lands between two engine steps
        while engine.policy_version != 6 and time.time() < deadline:
            time.sleep(0.01)
    finally:
        engine.shutdown()
        pool.shutdown()
    acc = result.accounting
    acc.check()  # started == trained + filtered + failed, nothing in flight
    assert acc.started == acc.trained + acc.num_filtered + acc.num_failed
    assert acc.trained == 6 * 2 * 2 == sum(len(g.trajectories) for g in trainer.groups)
    # The crashing group fails (env_error) — or, when Ray is slow to report the death on a loaded
    # machine, is still waiting when the run ends and is cancelled. Either way it is counted and
    # never trained; test_collector_survives_killed_and_crashed_actors pins the env_error path itself.
    crashed = acc.failed["env_error"] + acc.failed["cancelled"]
    assert crashed >= 2 and acc.statuses["env_error"] == acc.failed["env_error"]
    assert "g1" not in {g.group_id for g in trainer.groups}
    assert engine.policy_version == 6
    # Episodes still running when the run ended were cancelled; their actors were retired too.
    assert stats.actor_deaths + stats.calls_abandoned >= 1
    assert stats.actors_replaced == stats.actor_deaths + stats.calls_abandoned
