"""ToolEnvironment with ToolAgent: real calculator, concurrent calls, and every kind of bad call."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentax import _aio as aio
from agentax.agents import ToolAgent
from agentax.envs import EnvError, ToolEnvironment
from agentax.records import Action, Task, ToolCall, TrajectoryStatus
from agentax.tools import calculator, tool

TASK = Task(id="calc", prompt="What is 12*7?", answer="84")


def exact(task, response):
    return float(response.strip() == task.answer)


def call(name, **args):
    return f'<tool_call>{{"name": "{name}", "arguments": {__import__("json").dumps(args)}}}</tool_call>'


def test_calculator_episode_rewards_correct_answer(episode):
    agent = ToolAgent([calculator])
    env = ToolEnvironment([calculator], exact)
    traj, last, engine = episode(env, agent, [call("calculator", expression="12*7"), "84"], TASK)
    assert traj.status is TrajectoryStatus.OK and last.done and last.info["final_answer"] and traj.reward == 1.0
    assert engine.calls == 2
    tool_msg = agent.messages[-2]  # what the model saw before its second reply
    assert (tool_msg.role, tool_msg.content, tool_msg.name) == ("tool", "84", "calculator")
    assert tool_msg.tool_call_id == agent.messages[-3].tool_calls[0].id
    assert env.tool_stats["tool_calls"] == 1 and env.tool_stats["tool_errors"] == 0


@tool(timeout_s=2.0)
async def slow_echo(text: str) -> str:
    """Echo after a pause.

    Args:
        text: what to echo.
    """
    await asyncio.sleep(0.3)
    return text


@tool(timeout_s=0.05)
async def hangs(x: int) -> str:
    """Never answers in time.

    Args:
        x: ignored.
    """
    await asyncio.sleep(5)
    return "late"


@tool
def flood(n: int) -> str:
    """Returns n characters.

    Args:
        n: how many.
    """
    return "x" * n


def step(env, action):
    async def go():
        await env.reset(TASK)
        t0 = time.perf_counter()
        res = await env.step(action)
        return res, time.perf_counter() - t0

    return asyncio.run(go())


def test_calls_of_one_turn_run_concurrently_in_order():
    env = ToolEnvironment([slow_echo], exact)
    calls = tuple(ToolCall(name="slow_echo", arguments={"text": str(i)}, id=f"c{i}") for i in range(4))
    res, elapsed = step(env, Action(text="", tool_calls=calls))
    assert [r.content for r in res.observation.tool_results] == ["0", "1", "2", "3"]
    assert [r.call_id for r in res.observation.tool_results] == ["c0", "c1", "c2", "c3"]
    assert elapsed < 1.0  # 4 x 0.3 s sequentially would be 1.2 s
    assert not res.done and res.info["tool_calls"] == 4


def test_bad_calls_become_error_observations_and_are_counted():
    model_reply = (
        call("calculator", expression="2+2")
        + call("telepathy", mind="yours")  # unknown tool
        + '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'  # broken JSON
        + call("hangs", x=1)  # times out
        + call("flood", n=1_000_000)  # enormous output
        + call("calculator", wrong="arg")  # bad arguments
    )
    agent = ToolAgent([calculator, hangs, flood])
    agent.reset(TASK)
    action = agent.act(model_reply)
    assert len(action.tool_calls) == 5 and len(action.parse_errors) == 1 and action.final_answer is None
    assert agent.stats["unknown_tools"] == 1 and agent.stats["parse_errors"] == 1

    env = ToolEnvironment([calculator, hangs, flood], exact, max_output_chars=1000, call_grace_s=1.0)
    res, elapsed = step(env, action)
    results = res.observation.tool_results
    by_name = {r.name: r for r in results}
    assert results[0].ok and results[0].content == "4"
    assert by_name["telepathy"].error == "unknown_tool" and "calculator" in by_name["telepathy"].content
    assert by_name["hangs"].error == "timeout"
    assert len(by_name["flood"].content) <= 1000 and "truncated" in by_name["flood"].content
    assert results[4].error == "bad_arguments"
    assert results[-1].error == "parse_error" and "could not be parsed" in results[-1].content
    assert res.info == {
        "tool_calls": 5, "tool_errors": 4, "unknown_tools": 1, "parse_errors": 1, "tool_timeouts": 1, "dropped_calls": 0,
    }  # fmt: skip
    assert not res.done and elapsed < 3.0


def test_too_many_calls_are_refused_not_run():
    env = ToolEnvironment([calculator], exact, max_calls_per_turn=2)
    calls = tuple(ToolCall(name="calculator", arguments={"expression": f"{i}+1"}, id=str(i)) for i in range(3))
    res, _ = step(env, Action(text="", tool_calls=calls))
    assert [r.content for r in res.observation.tool_results[:2]] == ["1", "2"]
    assert res.observation.tool_results[2].error == "too_many_calls" and res.info["dropped_calls"] == 1


def test_endless_tool_use_is_truncated(episode):
    env = ToolEnvironment([calculator], exact, max_steps=3)
    traj, last, engine = episode(env, ToolAgent([calculator]), lambda text: call("calculator", expression="1+1"), TASK)
    assert traj.status is TrajectoryStatus.TRUNCATED and traj.info["reason"] == "env_truncated"
    assert last.truncated and engine.calls == 3 and traj.reward == 0.0


def test_reward_failures_are_reward_errors():
    def broken(task, response):
        raise KeyError("no answer key")

    async def slow(task, response):
        await asyncio.sleep(5)
        return 1.0

    for fn, kind in ((broken, "reward_error"), (slow, "reward_timeout")):
        env = ToolEnvironment([calculator], fn, reward_timeout_s=0.05)
        with pytest.raises(EnvError) as e:
            step(env, Action(text="84", final_answer="84"))
        assert e.value.status is TrajectoryStatus.REWARD_ERROR and e.value.kind == kind


def test_tool_calls_and_rewards_are_traced_on_the_episode_track():
    from agentax.trace import get_tracer, names

    tracer = get_tracer()

    async def go():
        env = ToolEnvironment([calculator], exact)
        with tracer.use_track(names.episode_track(7)):
            await env.reset(TASK)
            await env.step(Action(text="", tool_calls=(ToolCall(name="calculator", arguments={"expression": "1+1"}),)))
            await env.step(Action(text="84", final_answer="84"))

    tracer.take_events()
    asyncio.run(go())
    spans = [(e[4], e[3]) for e in tracer.take_events() if e[0] == 0]
    track = names.episode_track(7)
    assert spans.count((names.TOOL_CALL, track)) == 1 and spans.count((names.REWARD, track)) == 1
    # ENV_RESET / ENV_STEP belong to the collector, which wraps these calls
    assert not [n for n, _ in spans if n in (names.ENV_RESET, names.ENV_STEP)]


def test_tool_call_spans_say_whether_the_call_succeeded():
    from agentax.trace import get_tracer, names

    tracer = get_tracer()

    @tool(timeout_s=0.05)
    async def slow(seconds: float) -> str:
        """Sleeps."""
        await asyncio.sleep(seconds)
        return "done"

    async def go():
        env = ToolEnvironment([calculator, slow], exact, call_grace_s=0.0)
        await env.reset(TASK)
        await env.step(Action(text="", tool_calls=(
            ToolCall(name="calculator", arguments={"expression": "1+1"}),
            ToolCall(name="no_such_tool", arguments={}),
            ToolCall(name="slow", arguments={"seconds": 5}),
        )))

    tracer.take_events()
    asyncio.run(go())
    calls = {e[5]["tool"]: e[5] for e in tracer.take_events() if e[0] == 0 and e[4] == names.TOOL_CALL}
    assert calls["calculator"] == {"tool": "calculator", names.ARG_OK: True}
    assert calls["no_such_tool"][names.ARG_OK] is False and calls["no_such_tool"][names.ARG_ERROR]
    assert calls["slow"] == {"tool": "slow", names.ARG_OK: False, names.ARG_ERROR: "timeout"}


def test_a_tool_or_reward_that_swallows_its_cancellation_is_abandoned_not_awaited():
    """`asyncio.wait_for` waits for a cancelled call to unwind: a tool (or an async reward)
    whose retry loop catches CancelledError hung the episode for good. Now it is abandoned
    after the deadline and a short grace, and the episode goes on."""

    @tool(timeout_s=0.05)
    async def stubborn(x: int) -> str:
        """Retries for ever, even when cancelled.

        Args:
            x: ignored.
        """
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    async def stubborn_reward(task, response):
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    async def go(env, action):
        await env.reset(TASK)
        t0 = time.perf_counter()
        try:
            return await env.step(action), None
        except EnvError as e:
            return None, e
        finally:
            elapsed.append(time.perf_counter() - t0)

    # agentax's own loop runner (asyncio.run would wait at its end for the abandoned calls).
    elapsed = []
    action = Action(text="", tool_calls=(ToolCall(name="stubborn", arguments={"x": 1}),))
    res, _ = aio.run(go(ToolEnvironment([stubborn], exact, call_grace_s=0.05), action),
                     grace_s=0.1)
    assert res.observation.tool_results[0].error == "timeout" and elapsed[-1] < 5.0
    env = ToolEnvironment([calculator], stubborn_reward, reward_timeout_s=0.05)
    _, error = aio.run(go(env, Action(text="84", final_answer="84")), grace_s=0.1)
    assert error.kind == "reward_timeout" and elapsed[-1] < 5.0
