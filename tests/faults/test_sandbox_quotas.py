"""Sandbox quotas hold for the sandbox as a whole: forked children share one memory and process
limit, and all writes share one disk quota. Real bubblewrap processes, real cgroups, real tmpfs.

The group and disk tests skip (saying why) where the host offers no cgroup / no tmpfs mount;
the sandbox then warns once and keeps per-process rlimits, which `test_warns_once_*` checks.
"""

import asyncio
import logging
import os
import struct
import subprocess
import sys

import pytest

from agentax.envs import CodeEnvironment
from agentax.tools import Sandbox, SandboxConfig, SandboxUnavailableError, check_sandbox_available
from agentax.tools._sandbox_tools import format_sandbox_result
from agentax.tools import _isolation, _quota, _sandbox

try:
    check_sandbox_available()
    _REASON = None
except SandboxUnavailableError as e:
    _REASON = str(e)
needs_sandbox = pytest.mark.skipif(_REASON is not None, reason=f"sandbox unavailable: {_REASON}")
needs_group = pytest.mark.skipif(
    _quota.group_limits_reason() is not None, reason=f"no cgroup here: {_quota.group_limits_reason()}"
)

FAST = dict(timeout_s=20.0, cpu_time_s=10, max_output_bytes=4000, max_drain_bytes=2 * 2**20)

_FORK_AND_HOLD = """
import os, time
kids = []
for i in range({children}):
    pid = os.fork()
    if pid == 0:
        block = bytearray({mb} * 2**20)
        for j in range(0, len(block), 4096):
            block[j] = 1  # touch every page: resident, not just reserved
        time.sleep(1.0)  # all children hold their memory at the same time
        os._exit(0)
    kids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids]
print("CODES", codes)
"""


@needs_sandbox
@needs_group
def test_forked_children_share_one_memory_limit():
    # Each child stays far below memory_mb (its own RLIMIT_AS): per-process limits let all five
    # hold 100 MiB at once (500 MiB). The sandbox's group allows 256 MiB in total.
    with Sandbox(SandboxConfig(memory_mb=256, **FAST)) as sb:
        assert sb.quotas["group"]
        r = asyncio.run(sb.run_python(_FORK_AND_HOLD.format(children=5, mb=100)))
    line = [l for l in r.stdout.splitlines() if l.startswith("CODES")]
    assert line, r
    codes = eval(line[0][len("CODES"):])
    assert len(codes) == 5
    survived = codes.count(0)
    assert survived * 100 < 256, codes  # never more than the group's limit held at once
    assert codes.count(-9) >= 5 - 2, codes  # the rest were killed by the kernel at the limit


@needs_sandbox
@needs_group
def test_process_count_is_bounded_for_the_whole_sandbox():
    code = """
import os, time
n = 0
for i in range(40):
    try:
        if os.fork() == 0:
            time.sleep(2)
            os._exit(0)
        n += 1
    except OSError:
        break
print("FORKED", n)
"""
    with Sandbox(SandboxConfig(max_processes=10, **FAST)) as sb:
        r = asyncio.run(sb.run_python(code))
    forked = int(r.stdout.split("FORKED")[1])
    assert 0 < forked < 10, r


@needs_sandbox
def test_writes_stop_at_the_disk_quota():
    # max_file_mb bounds one file; the quota bounds them all, in /workspace and /tmp together.
    cfg = SandboxConfig(max_disk_mb=16, max_file_mb=4, **FAST)
    with Sandbox(cfg) as sb:
        if not sb.quotas["disk"]:
            pytest.skip(f"no tmpfs mount here: {_quota._REASONS.get('tmpfs')}")
        r = asyncio.run(sb.run_bash(
            "for i in $(seq 1 6); do head -c 4000000 /dev/zero > /workspace/w$i 2>/dev/null || echo FULL w$i; "
            "head -c 4000000 /dev/zero > /tmp/t$i 2>/dev/null || echo FULL t$i; done; echo END"
        ))
        assert "END" in r.stdout and "FULL" in r.stdout, r
        host_bytes = sum(os.path.getsize(os.path.join(d, f))
                         for d in (sb._work, sb._tmp) for f in os.listdir(d))
        assert host_bytes <= 16 * 2**20
        # a full quota does not stop the sandbox from running programs (or freeing space)
        again = asyncio.run(sb.run_python("import os; os.remove('/workspace/w1'); print('freed')"))
        assert again.ok and "freed" in again.stdout, again
        root = sb._root
    assert not os.path.exists(root)  # unmounted and deleted on close


@needs_sandbox
def test_environment_is_minimal_and_documented(monkeypatch):
    monkeypatch.setenv("AGENTAX_HOST_SECRET", "s3cret")
    with Sandbox(SandboxConfig(env={"EXTRA": "1"}, **FAST)) as sb:
        r = asyncio.run(sb.run_bash("env"))
    names = {line.split("=", 1)[0] for line in r.stdout.splitlines() if "=" in line}
    assert "s3cret" not in r.stdout
    documented = {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
                  "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "EXTRA"}
    # bash itself adds PWD, SHLVL and _ ; nothing else may appear
    assert names - documented <= {"PWD", "SHLVL", "_", "OLDPWD"}, names - documented
    for name in documented - {"EXTRA"}:
        assert name in (_sandbox.__doc__ or ""), f"{name} visible in the sandbox but not documented"


@needs_sandbox
def test_warns_once_and_keeps_rlimits_without_group_limits(monkeypatch, caplog):
    monkeypatch.setitem(_quota._REASONS, "cgroup", "PermissionError: not allowed (test)")
    monkeypatch.setitem(_quota._REASONS, "tmpfs", "EPERM (test)")
    monkeypatch.setattr(_sandbox, "_WARNED", [])
    with caplog.at_level(logging.WARNING, logger="agentax.sandbox"):
        for _ in range(3):
            with Sandbox(SandboxConfig(**FAST)) as sb:
                assert sb.quotas == {"group": False, "disk": False}
                r = asyncio.run(sb.run_python("print(6 * 7)"))
                assert r.ok and r.stdout.strip() == "42"
    warnings = [rec for rec in caplog.records if rec.name == "agentax.sandbox"]
    assert len(warnings) == 1
    assert "no memory/process limit per sandbox" in warnings[0].getMessage()
    assert "no disk quota per sandbox" in warnings[0].getMessage()


def test_code_environment_without_bubblewrap_fails_once_at_construction(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no prlimit
    monkeypatch.setattr(_isolation, "_PROBE_CACHE", {})
    with pytest.raises(SandboxUnavailableError) as info:
        CodeEnvironment(lambda task, answer: 1.0)
    message = str(info.value)
    assert "\n" not in message and "bubblewrap" in message


@needs_sandbox
@needs_group
def test_files_written_count_towards_memory_and_the_kill_is_named():
    with Sandbox(SandboxConfig(memory_mb=64, max_disk_mb=256, **FAST)) as sb:
        if not sb.quotas["disk"]:
            pytest.skip("no tmpfs mount here")
        r = asyncio.run(sb.run_bash("head -c 100000000 /dev/zero > /workspace/big; echo survived"))
        assert "survived" not in r.stdout and r.killed_reason == "memory_limit" and not r.ok, r
        assert sb.workdir.joinpath("big").stat().st_size < 64 * 2**20
        tool_result = format_sandbox_result(r, "bash")
        assert tool_result.error == "memory_limit" and "memory limit" in tool_result.content


@needs_sandbox
def test_quotas_left_by_a_killed_process_are_swept(tmp_path):
    code = ("import os\nfrom agentax.tools import Sandbox\nsb = Sandbox()\n"
            "print(sb._root, sb.quotas['disk'], sb._quotas.cgroup and sb._quotas.cgroup.dirs[0], flush=True)\n"
            "os._exit(0)  # like kill -9: no close, no finalizer\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    root, disk, group = out.stdout.split()
    if disk != "True" and group == "None":
        pytest.skip("no per-sandbox quotas on this host")
    with open("/proc/self/mountinfo") as f:
        assert (root in f.read()) == (disk == "True")
    assert _quota.sweep_stale() >= 1
    with open("/proc/self/mountinfo") as f:
        assert root not in f.read()
    assert not os.path.exists(root)
    assert group == "None" or not os.path.exists(group)


@needs_sandbox
def test_no_nested_user_namespace_so_no_tmpfs_past_the_disk_quota():
    # Issue 44 F13: `unshare -Urm` made the sandboxed program root of a namespace of its own,
    # where it mounted a tmpfs and wrote past max_disk_mb. The seccomp filter refuses it.
    if _isolation.seccomp_program() is None:
        pytest.skip("no seccomp filter for this machine's architecture")
    with Sandbox(SandboxConfig(max_disk_mb=16, max_file_mb=64, memory_mb=512, **FAST)) as sb:
        r = asyncio.run(sb.run_bash(
            "unshare -Urm sh -c 'mount -t tmpfs none /tmp && head -c 40000000 /dev/zero "
            "> /tmp/x && echo WROTE'; echo rc=$?; "
            "python3 -c 'import os; os.unshare(os.CLONE_NEWUSER)' 2>&1 | tail -1; "
            "unshare -m true; echo mount_ns=$?; sh -c 'echo child ok'"))
        assert "WROTE" not in r.stdout and "rc=1" in r.stdout, r
        assert "Operation not permitted" in r.stdout + r.stderr, r
        assert "child ok" in r.stdout  # ordinary processes still start (clone without the flag)


def test_seccomp_program_is_well_formed():
    program = _isolation.seccomp_program("x86_64")
    assert program is not None and len(program) % 8 == 0
    for i in range(0, len(program), 8):  # every jump lands inside the program
        code, jt, jf, _ = struct.unpack("<HBBI", program[i:i + 8])
        if code & 0x07 == 0x05:  # BPF_JMP
            assert i // 8 + 1 + max(jt, jf) < len(program) // 8
    assert _isolation.seccomp_program("sparc") is None
