"""User code that hangs at start-up, at teardown, or now and then in a synchronous step
(issue 61): a real `agentax train` process ends with one line naming the call, or trains every
step; and `ProcessEnvironment` kills a worker whose call hangs.

The faulty user code is tests/faults/faulty_user_code.py; the runs are real child processes
(tests/faults/fault_helpers.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from agentax import _aio as aio
from agentax.envs import EnvError, ProcessEnvironment
from agentax.recipes.calculator import tasks
from agentax.records import Action, TrajectoryStatus
from agentax.tools import close_mcp_connections, mcp_connection
from tests.faults.fault_helpers import TINY, error_lines, rl_steps, run, user_fault


def _train(tmp_path: Path, name: str, fault: str, *extra: str, steps: int = 2):
    return run(["train", *TINY, f"run.steps={steps}", f"run.runs_dir={tmp_path}",
                f"run.name={name}", *user_fault(fault), *extra], timeout=240)


@pytest.mark.parametrize("fault", ["close_sleeps", "close_blocks", "close_ignores_cancel"])
def test_a_close_that_hangs_at_start_up_stops_the_run_with_one_line(tmp_path, fault):
    out = _train(tmp_path, "r", fault, "collector.close_timeout_s=1")
    assert out.returncode == 1, out.stderr
    lines = [x for x in error_lines(out.stderr) if not x.startswith("agentax train ->")]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr and "never retrieved" not in out.stderr
    assert f"env.close() of env.factory=tests.faults.faulty_user_code:{fault}" in lines[0]
    assert "did not return within 1 s at start-up" in lines[0]
    assert "collector.close_timeout_s" in lines[0]
    # Nothing of the run is lost: its config is there to resume from after the fix.
    assert (tmp_path / "r" / "config.yaml").exists() and rl_steps(tmp_path / "r") == []


def test_a_factory_that_hangs_at_start_up_names_its_limit(tmp_path):
    out = _train(tmp_path, "r", "factory_hangs", "run.startup_timeout_s=1")
    assert out.returncode == 1, out.stderr
    lines = [x for x in error_lines(out.stderr) if not x.startswith("agentax train ->")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "env.factory=tests.faults.faulty_user_code:factory_hangs did not return" in lines[0]
    assert "run.startup_timeout_s" in lines[0]


@pytest.mark.parametrize("isolation", [  # each ~15 s of a real run; threads in the slow stage
    "process", pytest.param("thread", marks=pytest.mark.slow)])
def test_a_close_that_hangs_in_every_episode_costs_its_timeout_and_the_run_ends(
        tmp_path, isolation):
    out = _train(tmp_path, "r", "close_hangs_after_probe", "collector.close_timeout_s=0.5",
                 f"env.sync_isolation={isolation}")
    assert out.returncode == 0, out.stderr
    assert rl_steps(tmp_path / "r") == [1, 2]


def test_a_sync_env_that_hangs_now_and_then_trains_every_step(tmp_path):
    # Two env threads: on threads, the hung steps would use them up within a few episodes;
    # in worker processes each hang costs its episode (killed at step_timeout_s=1).
    out = _train(tmp_path, "r", "sync_sometimes_hangs", "env.kwargs={hang_rate: 0.25}",
                 "pipeline.env_threads=2")
    assert out.returncode == 0, out.stderr
    assert rl_steps(tmp_path / "r") == [1, 2]
    books = json.loads((tmp_path / "r" / "summary.json").read_text())["accounting"]
    assert books["started"] == (books["trained"] + sum(books["filtered"].values())
                                + sum(books["failed"].values()) + books["in_flight"])


# ------------------------------------------------------------------- ProcessEnvironment


FACTORY = "tests.faults.faulty_user_code:sync_sometimes_hangs"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between open and read
        return False


def test_process_environment_runs_a_sync_env_and_kills_a_hung_call():
    task = tasks(num_train=2, num_eval=1, seed=0)[0][0]

    async def main():
        env = ProcessEnvironment(FACTORY, {"hang_rate": 0.0}, step_timeout_s=1.0)
        obs = await env.reset(task)
        assert obs.content == task.prompt
        result = await env.step(Action(text="x", final_answer=str(task.answer)))
        assert result.done and result.reward == 1.0
        await env.close()
        assert env.exit_code == 0 and env.pid is None

        hung = ProcessEnvironment(FACTORY, {"hang_rate": 1.0}, step_timeout_s=0.5)
        await hung.reset(task)
        pid = hung.pid
        with pytest.raises(EnvError) as e:
            await hung.step(Action(text="x", final_answer="1"))
        assert e.value.status is TrajectoryStatus.TIMEOUT and e.value.kind == "timeout"
        assert hung.exit_code == -9 and hung.stats["timeouts"] == 1
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not _alive(pid)  # the hung worker is gone, with its memory and thread
        await hung.close()

    asyncio.run(main())


def test_process_environment_reports_a_factory_that_raises_and_a_worker_that_dies():
    task = tasks(num_train=2, num_eval=1, seed=0)[0][0]

    async def main():
        env = ProcessEnvironment("tests.faults.faulty_user_code:no_such_factory", {})
        with pytest.raises(EnvError) as e:
            await env.reset(task)
        assert "AttributeError" in str(e.value) and e.value.call == "reset"
        assert str(e.value).startswith("tests.faults.faulty_user_code:no_such_factory.reset:")

        env = ProcessEnvironment(FACTORY, {"hang_rate": 0.0}, step_timeout_s=5.0)
        await env.reset(task)
        os.kill(env.pid, 9)
        with pytest.raises(EnvError) as e:
            await env.step(Action(text="x", final_answer="1"))
        assert "died during step()" in str(e.value)
        await env.close()

    asyncio.run(main())


# --------------------------------------------------------------------- end-of-run teardown

MCP_SPEC = {"command": sys.executable,
            "args": [str(Path(__file__).parents[1] / "tools" / "mcp_test_server.py")]}


def test_the_loops_mcp_sessions_close_at_the_end_and_a_hung_close_is_bounded():
    async def main():
        conn = mcp_connection(MCP_SPEC)
        pid = int((await conn.call("pid", {})).content)
        assert await close_mcp_connections(5.0) == []  # closed: the server process ends
        hung = mcp_connection({**MCP_SPEC, "name": "stuck"})
        stuck_pid = int((await hung.call("pid", {})).content)

        async def ignores_cancellation():
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    continue

        real_close, hung.close = hung.close, ignores_cancellation  # the fault
        stuck = await close_mcp_connections(0.5)  # returns: 0.5 s, then 1 s of grace
        await real_close()
        return pid, stuck, stuck_pid

    pid, stuck, stuck_pid = aio.run(main(), grace_s=0.1)
    assert stuck == ["stuck"]  # named, and left behind
    assert stuck_pid != pid
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
