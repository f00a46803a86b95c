"""The code sandbox: escapes are contained and reported as tool errors; the host survives.

Real bubblewrap subprocesses, real files. Skipped (with the reason) where the host cannot
isolate code; `test_refuses_without_isolation` always runs.
"""

import asyncio
import os
import secrets
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from agentax.tools import (
    Sandbox,
    SandboxConfig,
    SandboxUnavailableError,
    bash_tool,
    check_sandbox_available,
    python_tool,
)
from agentax.tools import _isolation

try:
    check_sandbox_available()
    _REASON = None
except SandboxUnavailableError as e:
    _REASON = str(e)
needs_sandbox = pytest.mark.skipif(_REASON is not None, reason=f"sandbox unavailable: {_REASON}")

FAST = SandboxConfig(timeout_s=2.0, cpu_time_s=2, memory_mb=512, max_processes=32,
                     max_output_bytes=4000, max_drain_bytes=2 * 2**20)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def sandbox():
    with Sandbox(FAST) as sb:
        yield sb


def _pids_with_cmdline(needle: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if needle in Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d))
            except OSError:
                pass
    return out


@needs_sandbox
def test_runs_code_in_private_workdir(sandbox):
    r = run(sandbox.run_python("import os; print(os.getcwd()); open('note.txt', 'w').write('hi')"))
    assert r.ok and r.stdout.strip() == "/workspace" and r.exit_code == 0
    assert (sandbox.workdir / "note.txt").read_text() == "hi"  # visible on the host side
    r2 = run(sandbox.run_bash("cat note.txt; echo; echo err >&2; exit 3"))  # persists across runs
    assert r2.stdout.strip() == "hi" and r2.stderr.strip() == "err" and r2.exit_code == 3 and not r2.ok


@needs_sandbox
def test_socket_to_host_loopback_and_outside_is_blocked(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True).start()
    code = (f"import socket\ns = socket.socket(); s.settimeout(1)\ns.connect(('127.0.0.1', {port}))\n"
            "print('CONNECTED')")
    r = run(sandbox.run_python(code))
    assert r.exit_code != 0 and "CONNECTED" not in r.stdout and "ConnectionRefused" in r.stderr
    r = run(sandbox.run_python("import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=1)\nprint('OUT')"))
    assert r.exit_code != 0 and "OUT" not in r.stdout and ("unreachable" in r.stderr or "Errno" in r.stderr)
    server.close()
    time.sleep(0.05)
    assert accepted in ([], [None])


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


@needs_sandbox
def test_writes_outside_workdir_are_blocked(sandbox):
    marker = f"/tmp/escape_marker_{secrets.token_hex(4)}"
    repo_file = Path(__file__).resolve().parent / f"escape_{secrets.token_hex(4)}"
    code = f"""
import os
results = []
for path in [{marker!r}, {str(repo_file)!r}, "/etc/escape_marker", "/usr/escape_marker", "/escape"]:
    try:
        with open(path, "w") as f:
            f.write("x")
        results.append("wrote " + path)
    except OSError as e:
        results.append("blocked " + path + " " + type(e).__name__)
print("\\n".join(results))
"""
    r = run(sandbox.run_python(code))
    assert r.exit_code == 0
    assert not os.path.exists(marker) and not repo_file.exists()  # the host never sees them
    for p in [str(repo_file), "/etc/escape_marker", "/usr/escape_marker", "/escape"]:
        assert f"blocked {p}" in r.stdout
    r = run(sandbox.run_bash("mount -o remount,rw / 2>&1; echo rc=$?; id -u"))
    assert "rc=0" not in r.stdout


@needs_sandbox
def test_fork_bomb_is_bounded_and_killed(sandbox):
    code = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError:
    print("forks", n, flush=True)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    t0 = time.monotonic()
    r = run(sandbox.run_python(code))
    assert time.monotonic() - t0 < 6
    assert r.timed_out and r.killed_reason == "timeout"
    forks = int(r.stdout.split()[1])
    assert forks < FAST.max_processes
    assert run(sandbox.run_bash("echo alive")).stdout.strip() == "alive"


@needs_sandbox
def test_memory_limit(sandbox):
    r = run(sandbox.run_python("x = bytearray(10 * 2**30)\nprint('ALLOCATED')"))
    assert r.exit_code != 0 and "ALLOCATED" not in r.stdout and "MemoryError" in r.stderr


@needs_sandbox
def test_sleep_forever_is_killed_with_its_children(sandbox):
    tag = str(900000 + secrets.randbelow(99999))
    t0 = time.monotonic()
    r = run(sandbox.run_bash(f"sleep {tag} & sleep {tag}"))
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.killed_reason == "timeout" and not r.ok
    assert FAST.timeout_s <= elapsed < FAST.timeout_s + 3
    time.sleep(0.2)
    assert _pids_with_cmdline(f"sleep\0{tag}") == []
    r = run(sandbox.run_bash(f"(sleep {tag} &) ; echo started"))  # a detached child does not outlive the run
    assert r.ok and r.stdout.strip() == "started" and r.elapsed_s < 1.5
    time.sleep(0.2)
    assert _pids_with_cmdline(f"sleep\0{tag}") == []


@needs_sandbox
def test_output_flood_is_capped_and_killed(sandbox):
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)\n"
    t0 = time.monotonic()
    r = run(sandbox.run_python(code))
    assert time.monotonic() - t0 < 5
    assert r.killed_reason == "output_limit" and r.truncated and not r.ok
    assert len(r.stdout) < FAST.max_output_bytes + 200 and "output truncated" in r.stdout
    r = run(sandbox.run_python("print('HEAD'); print('y' * 100_000); print('TAIL')"))
    assert r.ok and r.truncated and r.stdout.startswith("HEAD") and r.stdout.rstrip().endswith("TAIL")


@needs_sandbox
def test_tools_report_failures_as_tool_errors(sandbox):
    py, sh = python_tool(sandbox), bash_tool(sandbox)
    r = run(py.call({"code": "print(6 * 7)"}))
    assert r.ok and r.content == "42"
    r = run(py.call({"code": "raise ValueError('bad')"}))
    assert (r.ok, r.error) == (False, "nonzero_exit") and "ValueError: bad" in r.content and "[exit code 1]" in r.content
    r = run(sh.call({"command": "sleep 30"}))
    assert (r.ok, r.error) == (False, "timeout") and "timed out" in r.content
    r = run(sh.call({"command": "yes | head -c 50000000"}))
    assert (r.ok, r.error) == (False, "output_limit") and len(r.content) <= py.max_output_chars
    r = run(sh.call({"cmd": "ls"}))
    assert r.error == "bad_arguments"


def test_refuses_without_isolation(monkeypatch, tmp_path):
    real_which = _isolation.shutil.which
    monkeypatch.setattr(_isolation.shutil, "which", lambda b: None if b == "bwrap" else real_which(b))
    monkeypatch.setattr(_isolation, "_PROBE_CACHE", {})
    with pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        Sandbox(FAST)
    with pytest.raises(SandboxUnavailableError, match="allow_unconfined"):
        check_sandbox_available(FAST)
    # explicit opt-in for trusted code: runs with rlimits in a temp dir, but says so
    with Sandbox(SandboxConfig(timeout_s=2.0, allow_unconfined=True), files={"a.txt": "A"}) as sb:
        assert not sb.confined
        r = run(sb.run_bash("cat a.txt; echo; pwd"))
        assert r.ok and r.stdout.splitlines() == ["A", str(sb.workdir)]
        r = run(sb.run_bash("sleep 30"))
        assert r.timed_out
    assert not sb.workdir.exists()


@needs_sandbox
def test_python_started_by_a_relative_path_runs_inside(tmp_path):
    """`cd examples && ../.venv/bin/python x.py` gives sys.executable ".../examples/../.venv/
    bin/python", a path that does not exist inside the sandbox: the config normalises it."""
    here = os.path.dirname(os.path.abspath(__file__))
    roundabout = os.path.join(here, os.path.relpath(os.path.abspath(sys.executable), here))
    assert ".." in roundabout
    config = SandboxConfig(timeout_s=5.0, python=roundabout)
    assert ".." not in config.python and os.path.samefile(config.python, sys.executable)
    with Sandbox(config) as sb:
        result = run(sb.run_python("print(6 * 7)"))
    assert result.exit_code == 0 and result.stdout.strip() == "42", result
