"""Environment base class: limits, timeouts, typed failures, sync adaptation, garbage returns."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentax.envs import EnvError, Environment, ensure_async_env
from agentax.records import Action, Observation, StepResult, Task, TrajectoryStatus

TASK = Task(id="t0", prompt="count")


class Counter(Environment):
    """Counts up; done at `target`."""

    def __init__(self, target=3, **kw):
        super().__init__(**kw)
        self.target = target

    async def _reset(self, task):
        self.n = 0
        return "start at 0"  # a plain string is accepted as the observation content

    async def _step(self, action):
        self.n += 1
        return StepResult(observation=Observation(content=str(self.n)), reward=1.0, done=self.n >= self.target)


def run(coro):
    return asyncio.run(coro)


def test_episode_runs_and_counts():
    async def go():
        env = Counter(target=2)
        obs = await env.reset(TASK)
        assert obs == Observation(content="start at 0")
        r1 = await env.step(Action(text="+"))
        r2 = await env.step(Action(text="+"))
        return env, r1, r2

    env, r1, r2 = run(go())
    assert (r1.done, r2.done, r2.truncated, r2.observation.content) == (False, True, False, "2")
    assert env.num_steps == 2 and env.stats["steps"] == 2 and env.stats["resets"] == 1


def test_max_steps_truncates():
    async def go():
        env = Counter(target=100, max_steps=2)
        await env.reset(TASK)
        return [await env.step(Action(text="+")) for _ in range(2)], env

    (r1, r2), env = run(go())
    assert not r1.done
    assert r2.done and r2.truncated and r2.info["truncated_by"] == "max_steps"
    assert env.stats["truncations"] == 1


def test_step_protocol_errors_say_what_to_do():
    async def go():
        env = Counter(target=1)
        with pytest.raises(RuntimeError, match="before reset"):
            await env.step(Action(text="+"))
        await env.reset(TASK)
        await env.step(Action(text="+"))
        with pytest.raises(RuntimeError, match="after the episode ended"):
            await env.step(Action(text="+"))
        with pytest.raises(TypeError, match="Action"):
            await env.step("+")

    run(go())


class Raising(Counter):
    async def _step(self, action):
        raise ZeroDivisionError("boom")


class Hanging(Counter):
    async def _step(self, action):
        await asyncio.sleep(30)


class Garbage(Counter):
    def __init__(self, value, **kw):
        super().__init__(**kw)
        self.value = value

    async def _step(self, action):
        return self.value


def test_raising_step_becomes_env_error_and_breaks_env():
    async def go():
        env = Raising()
        await env.reset(TASK)
        with pytest.raises(EnvError) as e1:
            await env.step(Action(text="x"))
        with pytest.raises(EnvError) as e2:
            await env.step(Action(text="x"))
        return env, e1.value, e2.value

    env, e1, e2 = run(go())
    assert e1.status is TrajectoryStatus.ENV_ERROR and e1.kind == "exception" and "ZeroDivisionError: boom" in e1.message
    assert e2.kind == "broken"
    assert env.stats["errors"] == 1


def test_hanging_step_times_out_quickly():
    async def go():
        env = Hanging(step_timeout_s=0.05)
        await env.reset(TASK)
        t0 = time.perf_counter()
        with pytest.raises(EnvError) as e:
            await env.step(Action(text="x"))
        return env, e.value, time.perf_counter() - t0

    env, err, elapsed = run(go())
    assert err.status is TrajectoryStatus.TIMEOUT and err.kind == "timeout" and err.call == "step"
    assert elapsed < 2.0
    assert env.stats["timeouts"] == 1


class SlowReset(Counter):
    async def _reset(self, task):
        await asyncio.sleep(30)


def test_hanging_reset_times_out():
    async def go():
        env = SlowReset(reset_timeout_s=0.05)
        with pytest.raises(EnvError) as e:
            await env.reset(TASK)
        return e.value

    err = run(go())
    assert (err.status, err.call) == (TrajectoryStatus.TIMEOUT, "reset")


@pytest.mark.parametrize(
    "value, fragment",
    [
        ({"observation": "x"}, "returned dict; expected StepResult"),
        (None, "returned NoneType"),
        (StepResult(observation="text", reward=1.0), "observation is str"),
        (StepResult(observation=Observation(), reward=float("nan")), "finite number"),
        (StepResult(observation=Observation(), reward="lots"), "finite number"),
    ],
)
def test_garbage_returns_become_env_error(value, fragment):
    async def go():
        env = Garbage(value)
        await env.reset(TASK)
        with pytest.raises(EnvError) as e:
            await env.step(Action(text="x"))
        return env, e.value

    env, err = run(go())
    assert err.kind == "bad_return" and err.status is TrajectoryStatus.ENV_ERROR
    assert fragment in err.message
    assert env.stats["bad_returns"] == 1


def test_garbage_reset_and_sync_hook_are_clear_errors():
    class BadReset(Counter):
        async def _reset(self, task):
            return 42

    class SyncHook(Counter):
        def _step(self, action):  # forgot `async`
            return StepResult(observation=Observation())

    async def go():
        with pytest.raises(EnvError, match="expected Observation or str"):
            await BadReset().reset(TASK)
        env = SyncHook()
        await env.reset(TASK)
        with pytest.raises(EnvError, match="must be `async def`"):
            await env.step(Action(text="x"))

    run(go())


def test_subclass_without_super_init_still_works():
    class Minimal(Environment):
        def __init__(self):  # no super().__init__()
            self.k = 0

        async def _reset(self, task):
            return Observation(content=task.prompt)

        async def _step(self, action):
            return StepResult(observation=Observation(content="bye"), reward=2.0, done=True)

    async def go():
        env = Minimal()
        await env.reset(TASK)
        return await env.step(Action(text="hi")), env

    res, env = run(go())
    assert res.reward == 2.0 and res.done and env.stats["steps"] == 1


class SyncCounter:
    """A plain synchronous environment: no base class, no async."""

    step_timeout_s = 0.2

    def __init__(self, sleep_s=0.0):
        self.sleep_s = sleep_s
        self.threads = set()
        self.closed = False

    def reset(self, task):
        self.threads.add(threading.get_ident())
        return Observation(content="ready")

    def step(self, action):
        self.threads.add(threading.get_ident())
        time.sleep(self.sleep_s)
        return StepResult(observation=Observation(content="ok"), reward=0.5, done=True)

    def close(self):
        self.closed = True


def test_sync_env_runs_on_its_own_thread():
    inner = SyncCounter()
    env = ensure_async_env(inner)
    assert ensure_async_env(env) is env

    async def go():
        await env.reset(TASK)
        res = await env.step(Action(text="x"))
        await env.close()
        return res

    res = run(go())
    assert res.reward == 0.5 and res.done
    assert inner.closed
    # Off the event loop's thread, on the shared "env" stage pool (any of its threads).
    assert threading.main_thread().ident not in inner.threads


def test_hung_sync_env_leaves_the_event_loop_free():
    inner = SyncCounter(sleep_s=1.0)
    env = ensure_async_env(inner)  # picks up step_timeout_s = 0.2 from the object

    async def ticker(stop):
        n = 0
        while not stop.is_set():
            await asyncio.sleep(0.01)
            n += 1
        return n

    async def go():
        await env.reset(TASK)
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        t0 = time.perf_counter()
        with pytest.raises(EnvError) as e:
            await env.step(Action(text="x"))
        elapsed = time.perf_counter() - t0
        stop.set()
        await env.close()
        return e.value, elapsed, await tick

    err, elapsed, ticks = run(go())
    assert err.status is TrajectoryStatus.TIMEOUT
    assert not inner.closed  # close() did not queue behind the hung step
    assert elapsed < 0.9  # did not wait for the 1 s sleep
    assert ticks >= 5  # the event loop kept running while the step hung
    assert env.stats["timeouts"] == 1


def test_ensure_async_env_rejects_non_envs_and_accepts_async_duck():
    with pytest.raises(TypeError, match="lacks step"):
        ensure_async_env(type("NoStep", (), {"reset": lambda self, t: None})())

    class Duck:
        async def reset(self, task):
            return "hello"

        async def step(self, action):
            return StepResult(observation=Observation(content=action.text.upper()), done=True)

    async def go():
        env = ensure_async_env(Duck(), max_steps=5)
        obs = await env.reset(TASK)
        return obs, await env.step(Action(text="abc")), env

    obs, res, env = run(go())
    assert obs.content == "hello" and res.observation.content == "ABC" and env.max_steps == 5


def test_cancellation_propagates_and_close_never_raises():
    class BadClose(Hanging):
        async def _close(self):
            raise OSError("cannot close")

    async def go():
        env = BadClose()
        await env.reset(TASK)
        task = asyncio.create_task(env.step(Action(text="x")))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await env.close()  # a failing close is counted, not raised
        return env

    env = run(go())
    assert env.stats["errors"] == 1


def test_invalid_limits_are_rejected():
    with pytest.raises(ValueError, match="max_steps"):
        Counter(max_steps=0)
    with pytest.raises(ValueError, match="step_timeout_s"):
        Counter(step_timeout_s=-1)


class GatedCounter(SyncCounter):
    """Its first step hangs until the test opens the gate; later steps say how many steps were
    in flight when they started."""

    def __init__(self):
        super().__init__()
        self.gate, self.in_flight, self.seen_in_flight = threading.Event(), 0, []

    def step(self, action):
        self.in_flight += 1
        self.seen_in_flight.append(self.in_flight)
        try:
            if len(self.seen_in_flight) == 1:
                self.gate.wait(30)
            return super().step(action)
        finally:
            self.in_flight -= 1


def test_sync_env_recovers_after_a_hung_step():
    inner = GatedCounter()
    env = ensure_async_env(inner)

    async def go():
        await env.reset(TASK)
        with pytest.raises(EnvError):
            await env.step(Action(text="x"))  # hangs past step_timeout_s = 0.2
        await env.reset(TASK)
        res = await env.step(Action(text="y"))  # not queued behind the hung call
        return res

    try:
        res = run(go())
    finally:
        inner.gate.set()
    # The second step ran while the first was still hung on its thread.
    assert res.done and inner.seen_in_flight == [1, 2]
