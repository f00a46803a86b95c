"""CodeEnvironment and SWEEnvironment on the real sandbox (bubblewrap), with scripted agents."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentax.agents import SWEAgent, ToolAgent
from agentax.envs import SWE_REPOS, CodeEnvironment, SWEEnvironment, swe_tasks
from agentax.records import Action, Task, ToolCall, TrajectoryStatus
from agentax.tools import SandboxConfig, SandboxUnavailableError, check_sandbox_available

try:
    check_sandbox_available()
except SandboxUnavailableError as e:  # pragma: no cover - depends on the host
    pytest.skip(f"sandbox unavailable: {e}", allow_module_level=True)


def call(name, **args):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


def count_file_is(expected):
    def check(sandbox, task, answer):
        return float(sandbox.read_file("count.txt").strip() == expected)

    return check


BASH_TASK = Task(
    id="bash/count",
    prompt="Count the lines of data.txt and write the number to count.txt.",
    meta={"files": {"data.txt": "a\nb\nc\n"}},
)


def test_bash_task_scored_from_sandbox_state(episode):
    env = CodeEnvironment(check=count_file_is("3"), tools=("bash",), sandbox_config=SandboxConfig(timeout_s=5))
    replies = [call("bash", command="wc -l < data.txt > count.txt && cat count.txt"), "Done."]
    agent = ToolAgent([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}])
    traj, last, engine = episode(env, agent, replies, BASH_TASK)
    assert traj.status is TrajectoryStatus.OK and traj.reward == 1.0 and engine.calls == 2
    assert [m.content.strip() for m in agent.messages if m.role == "tool"] == ["3"]
    assert env.sandbox is None  # closed with the episode


def test_python_tool_runs_and_runaway_code_is_killed():
    env = CodeEnvironment(lambda t, a: 0.0, tools=("python",), sandbox_config=SandboxConfig(timeout_s=1.0))

    async def go():
        obs = await env.reset(Task(id="py", prompt="compute"))
        ok = await env.step(Action(text="", tool_calls=(ToolCall(name="python", arguments={"code": "print(sum(range(10)))"}),)))
        loop = await env.step(Action(text="", tool_calls=(ToolCall(name="python", arguments={"code": "while True: pass"}),)))
        crash = await env.step(Action(text="", tool_calls=(ToolCall(name="python", arguments={"code": "1/0"}),)))
        await env.close()
        return obs, ok, loop, crash

    obs, ok, loop, crash = asyncio.run(go())
    assert obs.info["tools"] == ["python"]
    assert ok.observation.tool_results[0].content.strip() == "45"
    assert loop.observation.tool_results[0].error == "timeout" and loop.info["tool_timeouts"] == 1
    assert crash.observation.tool_results[0].error == "nonzero_exit"
    assert "ZeroDivisionError" in crash.observation.tool_results[0].content


def test_code_environment_needs_one_scorer():
    with pytest.raises(ValueError, match="exactly one"):
        CodeEnvironment()
    with pytest.raises(ValueError, match="subset"):
        CodeEnvironment(lambda t, a: 0.0, tools=("ruby",))


def test_swe_agent_fixes_a_repository(episode):
    (task,) = swe_tasks(["intervals"])
    path, old, new = SWE_REPOS["intervals"]["fix"]
    replies = (
        [
            call("search", pattern="def merge"),
            call("read_file", path="intervals.py"),
            call("run_tests"),
            call("replace_in_file", path=path, old=old, new=new),
            call("run_tests"),
            "Fixed merge() to join touching intervals (< became <=).",
        ]
    )
    env = SWEEnvironment()
    agent = SWEAgent()
    assert {t["function"]["name"] for t in agent.tools} == {
        "list_files", "read_file", "search", "write_file", "replace_in_file", "run_tests"
    }
    traj, last, _ = episode(env, agent, replies, task)
    assert traj.status is TrajectoryStatus.OK and traj.reward == 1.0 and last.info["tests_passed"]
    seen = [m.content for m in agent.messages if m.role == "tool"]
    assert "intervals.py:4:def merge" in seen[0] and "start < merged" in seen[1]
    assert "1 failed" in seen[2] and "3 passed" in seen[4]
    reminders = [m for m in agent.messages if m.role == "user" and "still fail" in m.content]
    assert len(reminders) == 1  # after the failing run only


def test_swe_unfixed_repository_scores_zero():
    (task,) = swe_tasks(["roman"])

    async def go():
        env = SWEEnvironment()
        await env.reset(task)
        res = await env.step(Action(text="I fixed it.", final_answer="I fixed it."))
        await env.close()
        return res

    res = asyncio.run(go())
    assert res.done and res.reward == 0.0 and not res.info["tests_passed"]
    assert "IV" in res.info["test_output"]


def test_swe_tasks_rejects_unknown_names():
    with pytest.raises(ValueError, match="built-in"):
        swe_tasks(["nope"])

