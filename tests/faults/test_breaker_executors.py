"""Hung synchronous user code: per-stage bounded pools, daemon threads, a process that exits."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

import pytest

from agentax._executors import StageExecutor, set_stage_threads, stage_executor
from agentax.envs import EnvError, compute_reward, ensure_async_env
from agentax.records import Action, Observation, StepResult, Task, TrajectoryStatus
from agentax.tools import Tool

TASK = Task(id="t", prompt="p")


def test_hung_sync_tools_do_not_starve_an_unrelated_reward():
    release = threading.Event()
    set_stage_threads(tool=8)
    try:
        hang = Tool(name="hang", description="blocks", parameters={"type": "object", "properties": {}},
                    fn=lambda: release.wait(60), timeout_s=0.2)

        async def main():
            results = await asyncio.gather(*(hang.call({}) for _ in range(8)))
            assert [r.error for r in results] == ["timeout"] * 8
            assert stage_executor("tool").busy == 8  # all tool threads still held by hung calls
            return await compute_reward(lambda task, resp: 0.5, TASK, "x", timeout_s=2.0)

        assert asyncio.run(main()) == 0.5
    finally:
        release.set()
        set_stage_threads(tool=32)


def test_stage_pool_is_bounded_and_reusable():
    pool = StageExecutor("test", 2)
    gate = threading.Event()
    futures = [pool.submit(gate.wait, 30) for _ in range(5)]
    assert pool.threads == 2  # the bound holds however many calls wait
    gate.set()
    assert [f.result(timeout=30) for f in futures] == [True] * 5
    assert pool.submit(lambda: 7).result(timeout=30) == 7 and pool.threads == 2
    pool.shutdown()
    assert pool.threads == 0
    assert pool.submit(lambda: 8).result(timeout=30) == 8  # usable again after shutdown
    pool.shutdown()


def test_unknown_stage_is_rejected():
    with pytest.raises(ValueError, match="unknown stage"):
        stage_executor("gpu")
    with pytest.raises(ValueError, match="env threads must be >= 1"):
        set_stage_threads(env=0)


class _HangingSyncEnv:
    def __init__(self):
        self.release = threading.Event()

    def reset(self, task):
        return Observation(content="hi")

    def step(self, action):
        self.release.wait()  # hangs until the test ends
        return StepResult(observation=Observation(content=""), reward=0.0, done=True)


def test_sync_step_times_out_and_marks_env_broken():
    hanging = _HangingSyncEnv()
    env = ensure_async_env(hanging, step_timeout_s=0.2)

    async def main():
        await env.reset(TASK)
        with pytest.raises(EnvError) as info:
            await env.step(Action(text="x"))
        assert info.value.status is TrajectoryStatus.TIMEOUT
        await env.close()  # does not wait for the hung call

    try:
        asyncio.run(main())
    finally:  # a call still hung at exit would hold pytest's exit for EXIT_WAIT_S
        hanging.release.set()


def test_a_process_with_a_hung_sync_step_still_exits():
    script = textwrap.dedent("""
        import asyncio, threading
        import agentax._executors
        from agentax.envs import EnvError, ensure_async_env
        from agentax.records import Action, Observation, Task

        agentax._executors.EXIT_WAIT_S = 0.5  # how long the exit waits for the hung call

        class Env:
            def reset(self, task):
                return Observation(content="hi")
            def step(self, action):
                threading.Event().wait()  # hangs forever

        async def main():
            env = ensure_async_env(Env(), step_timeout_s=0.2)
            await env.reset(Task(id="t", prompt="p"))
            try:
                await env.step(Action(text="x"))
            except EnvError as e:
                print("step:", e.kind)
            await env.close()

        asyncio.run(main())
        print("done")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["step:", "timeout", "done"]
    # The step was abandoned past its timeout: known to hang, so the exit does not wait for
    # it (nor warn about it); only calls still doing live work get EXIT_WAIT_S.
    assert "still running on stage threads" not in out.stderr


def test_a_process_exits_cleanly_while_a_stage_call_runs_jax():
    # A JAX reward (or environment step) still running on a daemon stage thread when the
    # interpreter finalized aborted the process (SIGABRT, 4 of 4 runs) after a good run; the
    # exit now waits for it (at most EXIT_WAIT_S).
    script = textwrap.dedent("""
        import time
        import jax, jax.numpy as jnp
        from agentax._executors import stage_executor

        f = jax.jit(lambda a: jnp.tanh(a @ a) @ a)
        a = jnp.ones((512, 512))
        f(a).block_until_ready()

        def reward():  # device work for 1 s, the process leaves after 0.3 s
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                f(a).block_until_ready()
            return 1.0

        stage_executor("reward").submit(reward)
        time.sleep(0.3)
        print("leaving")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["leaving"]
