"""MCP servers as tools, against a real MCP server (tests/tools/mcp_test_server.py) started as a
stdio subprocess, and over streamable HTTP on loopback: listing and schemas, calls and their
results, error results, protocol errors, timeouts, a killed server restarted, per-episode
reset hooks, bad specs, and the tools offered by ToolEnvironment and ToolAgent."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from agentax.agents import ToolAgent  # noqa: E402
from agentax.envs import ToolEnvironment  # noqa: E402
from agentax.records import Action, Task, ToolCall  # noqa: E402
from agentax.tools import (  # noqa: E402
    MCPConnection,
    MCPUnavailableError,
    mcp_connection,
    mcp_server_specs,
    mcp_tools,
    mcp_tools_sync,
)

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
SPEC = {"command": "python", "args": [SERVER], "env": {"AGENTAX_TEST_GREETING": "hello"}}
TASK = Task(id="t", prompt="q", answer="3")


def _exact(task, answer):
    return float(answer.strip() == task.answer)


def test_tools_are_listed_with_their_schemas_and_called():
    async def main():
        tools = {t.name: t for t in await mcp_tools([SPEC])}
        add = tools["add"]
        schema = add.schema()["function"]
        assert schema["description"] == "Adds two integers."
        assert schema["parameters"]["properties"]["a"]["type"] == "integer"
        assert schema["parameters"]["required"] == ["a", "b"]
        ok = await add.call({"a": 2, "b": 40}, call_id="c1")
        text = await tools["echo"].call('{"text": "hi there"}')  # JSON text, as parsers give it
        greeting = await tools["greeting"].call({})
        structured = await tools["structured_only"].call({})
        picture = await tools["picture"].call({})
        return ok, text, greeting, structured, picture

    ok, text, greeting, structured, picture = asyncio.run(main())
    assert (ok.ok, ok.content, ok.call_id, ok.name) == (True, "42", "c1", "add")
    assert text.content == "hi there"
    assert greeting.content == "hello"  # the spec's env reached the subprocess
    assert structured.ok and structured.content == '{"answer": 42, "unit": "zorb"}'
    assert picture.content == "a cat\n[image: image/png]"


def test_errors_come_back_as_results_the_model_reads():
    async def main():
        conn = mcp_connection(SPEC)
        tools = {t.name: t for t in await mcp_tools([SPEC])}
        return (await conn.call("refuse", {"reason": "not today"}),
                await conn.call("protocol_error", {}),
                await conn.call("no_such_tool", {}),
                await tools["add"].call({"a": 1}),  # caught by agentax's own schema check
                await conn.call("add", {"a": "x", "b": 1}),  # caught by the server
                await conn.call("add", {"a": 1, "b": 1}),
                dict(conn.stats))

    refuse, protocol, unknown, missing, bad_type, fine, stats = asyncio.run(main())
    assert (refuse.ok, refuse.error) == (False, "tool_error") and "not today" in refuse.content
    assert refuse.content.startswith("Error")
    assert (protocol.ok, protocol.error) == (False, "protocol_error")
    assert "this request is invalid" in protocol.content
    assert not unknown.ok and "no_such_tool" in unknown.content
    assert (missing.ok, missing.error) == (False, "bad_arguments")
    assert not bad_type.ok and "a" in bad_type.content
    assert fine.ok and fine.content == "2"  # the session survived every error above
    assert stats["starts"] == 1 and stats["protocol_errors"] == 1 and stats["tool_errors"] >= 2


def test_a_call_that_runs_past_its_timeout_is_a_timeout_result():
    async def main():
        conn = mcp_connection({**SPEC, "timeout_s": 0.3})
        await conn.call("echo", {"text": "started"})  # the server's start is not the call's
        t0 = time.monotonic()
        slow = await conn.call("sleep", {"seconds": 120})
        took = time.monotonic() - t0
        after = await conn.call("echo", {"text": "still here"})
        return slow, took, after, conn.stats["timeouts"]

    slow, took, after, timeouts = asyncio.run(main())
    assert (slow.ok, slow.error) == (False, "timeout") and "0.3 s" in slow.content
    assert took < 60 and timeouts == 1  # it did not wait for the 120 s tool
    assert after.ok and after.content == "still here"


def test_a_dead_server_is_restarted_by_the_next_call():
    async def main():
        conn = mcp_connection(SPEC)
        first = int((await conn.call("pid", {})).content)
        os.kill(first, signal.SIGKILL)
        for _ in range(100):  # wait until the process is gone
            try:
                os.kill(first, 0)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.02)
        lost = await conn.call("echo", {"text": "x"})
        back = await conn.call("pid", {})
        return first, lost, back, dict(conn.stats)

    first, lost, back, stats = asyncio.run(main())
    assert (lost.ok, lost.error) == (False, "server_died")
    assert "restarted" in lost.content
    assert back.ok and int(back.content) != first
    assert stats["starts"] == 2 and stats["restarts"] == 1 and stats["server_died"] == 1


def test_one_process_serves_every_environment_of_a_loop_and_concurrent_calls():
    async def main():
        envs = [ToolEnvironment(reward_fn=_exact, mcp_servers=[SPEC]) for _ in range(4)]
        for env in envs:
            await env.reset(TASK)
        calls = [ToolCall(name="add", arguments={"a": i, "b": 1}, id=f"c{i}") for i in range(12)]
        steps = await asyncio.gather(*(envs[i % 4].step(Action(text="", tool_calls=(c,)))
                                       for i, c in enumerate(calls)))
        pids = {(await env.step(Action(text="", tool_calls=(ToolCall(name="pid"),)))
                 ).observation.tool_results[0].content for env in envs}
        for env in envs:
            await env.close()
        return steps, pids, mcp_connection(SPEC).stats["starts"]

    steps, pids, starts = asyncio.run(main())
    assert [s.observation.tool_results[0].content for s in steps] == [str(i + 1) for i in range(12)]
    assert len(pids) == 1 and starts == 1


def test_tool_environment_offers_mcp_tools_next_to_native_ones_and_scores():
    from agentax.tools import calculator

    async def main():
        env = ToolEnvironment([calculator], _exact, mcp_servers=[{**SPEC, "prefix": "srv_",
                                                                  "tools": ["add", "echo"]}])
        obs = await env.reset(TASK)
        names = [t["function"]["name"] for t in env.tools]
        step = await env.step(Action(text="", tool_calls=(
            ToolCall(name="srv_add", arguments={"a": 1, "b": 2}, id="1"),
            ToolCall(name="srv_refuse", arguments={"reason": "x"}, id="2"))))
        final = await env.step(Action(text="3", final_answer="3"))
        await env.close()
        return obs, names, step, final

    obs, names, step, final = asyncio.run(main())
    assert names == ["calculator", "srv_add", "srv_echo"] == list(obs.info["tools"])
    added, unknown = step.observation.tool_results
    assert (added.ok, added.content, added.name) == (True, "3", "srv_add")
    assert unknown.error == "unknown_tool"  # left out by the spec's `tools` list
    assert step.info["tool_calls"] == 2 and step.info["unknown_tools"] == 1
    assert final.done and final.reward == 1.0


def test_reset_hook_and_per_episode_sessions_for_a_stateful_server():
    shared = {**SPEC, "reset_tool": "reset_counter", "reset_arguments": {"start": 10}}
    private = {**SPEC, "per_episode": True}

    async def episode(spec):
        env = ToolEnvironment(reward_fn=_exact, mcp_servers=[spec])
        await env.reset(TASK)
        inc = Action(text="", tool_calls=(ToolCall(name="increment", id="i"),))
        counts = [(await env.step(inc)).observation.tool_results[0].content for _ in range(2)]
        pid = (await env.step(Action(text="", tool_calls=(ToolCall(name="pid", id="p"),)))
               ).observation.tool_results[0].content
        await env.close()
        return counts, pid

    async def main():
        return ([await episode(shared) for _ in range(2)],
                [await episode(private) for _ in range(2)])

    with_hook, per_episode = asyncio.run(main())
    assert [c for c, _ in with_hook] == [["11", "12"], ["11", "12"]]  # reset at each episode
    assert with_hook[0][1] == with_hook[1][1]  # one shared process
    assert [c for c, _ in per_episode] == [["1", "2"], ["1", "2"]]  # a fresh process each
    assert per_episode[0][1] != per_episode[1][1]


def test_tool_agent_lists_mcp_tools_in_the_chat_template_format():
    agent = ToolAgent(mcp_servers=[{**SPEC, "tools": ["add"]}])
    (schema,) = agent.tools
    assert schema["type"] == "function" and schema["function"]["name"] == "add"
    assert schema["function"]["parameters"]["required"] == ["a", "b"]
    action = agent.act('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert action.tool_calls[0].name == "add" and agent.stats.get("unknown_tools", 0) == 0
    # The listing is kept: a second agent (one per episode) starts no server.
    t0 = time.monotonic()
    ToolAgent(mcp_servers=[{**SPEC, "tools": ["add"]}])
    assert time.monotonic() - t0 < 0.2


def test_a_server_that_cannot_start_is_reported_in_one_line():
    bad = {"command": "python", "args": ["-c", "import sys; sys.stderr.write('no config'); sys.exit(3)"]}

    async def main():
        result = await mcp_connection(bad).call("anything", {})
        with pytest.raises(MCPUnavailableError, match="no config"):
            await mcp_tools([bad])
        return result

    result = asyncio.run(main())
    assert (result.ok, result.error) == (False, "unavailable") and "no config" in result.content
    with pytest.raises(MCPUnavailableError, match="No such file"):
        mcp_tools_sync([{"command": "/nonexistent/mcp-server"}])


@pytest.mark.parametrize("value, message", [
    ([{"args": ["x"]}], r"mcp_servers\[0\] needs exactly one of 'command'"),
    ([{"command": "a", "url": "http://x"}], r"mcp_servers\[0\] needs exactly one of"),
    ([{"command": "a", "args": "x y"}], r"mcp_servers\[0\]\.args must be a list of strings"),
    ([{"command": "a"}, {"command": "b", "argz": []}], r"mcp_servers\[1\]\.argz is not a field"),
    ([{"command": "a", "env": ["X=1"]}], r"mcp_servers\[0\]\.env must be a mapping"),
    ([{"url": "localhost:8000"}], r"mcp_servers\[0\]\.url must be an http"),
    ([{"url": "http://h/mcp", "args": []}], r"mcp_servers\[0\]\.args is for stdio servers"),
    ([{"command": "a", "timeout_s": 0}], r"mcp_servers\[0\]\.timeout_s must be a number"),
    ([{"command": "a", "prefix": "1x"}], r"mcp_servers\[0\]\.prefix must start"),
    ([{"command": "a", "reset_arguments": {"x": 1}}], r"reset_arguments is set but reset_tool"),
    ("python server.py", r"mcp_servers must be a list of servers"),
])
def test_bad_specs_name_the_field(value, message):
    with pytest.raises(ValueError, match=message):
        mcp_server_specs(value)
    with pytest.raises(ValueError, match=message):
        ToolEnvironment(reward_fn=_exact, mcp_servers=value)


def test_unusable_tool_lists_are_one_line_errors():
    with pytest.raises(ValueError, match="has no tool named 'nope'"):
        mcp_tools_sync([{**SPEC, "tools": ["nope"]}])
    with pytest.raises(ValueError, match="two MCP tools are named 'echo'"):
        mcp_tools_sync([SPEC, {**SPEC, "name": "again", "args": [SERVER, "--again"]}])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_server_listing_calls_and_reconnect():
    pytest.importorskip("uvicorn")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spec = {"url": f"http://127.0.0.1:{port}/mcp", "prefix": "web_", "timeout_s": 0.5}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
                time.sleep(0.1)

        async def main():
            tools = {t.name: t for t in await mcp_tools([spec])}
            conn = mcp_connection(spec)
            out = [await tools["web_add"].call({"a": 20, "b": 22}),
                   await conn.call("refuse", {"reason": "http"}),
                   await conn.call("sleep", {"seconds": 3})]
            proc.kill()
            proc.wait()
            out.append(await conn.call("add", {"a": 1, "b": 1}))
            return out

        added, refused, slow, gone = asyncio.run(main())
    finally:
        proc.kill()
        proc.wait()
    assert added.ok and added.content == "42" and added.name == "web_add"
    assert refused.error == "tool_error"
    assert slow.error == "timeout"
    assert not gone.ok and gone.error in ("server_died", "unavailable")


def test_connection_close_ends_the_stdio_process():
    async def main():
        conn = MCPConnection(mcp_server_specs([SPEC])[0])
        pid = int((await conn.call("pid", {})).content)
        await conn.close()
        return pid

    pid = asyncio.run(main())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    pytest.fail(f"server process {pid} still alive after close()")
