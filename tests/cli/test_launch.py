"""The `agentax` command re-executes itself once with malloc on transparent huge pages."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentax import __main__ as launch


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A Linux host whose glibc version and THP mode the test chooses."""
    thp = tmp_path / "enabled"

    def make(glibc="glibc 2.36", mode="always [madvise] never", tunables=None):
        thp.write_text(mode + "\n")
        monkeypatch.setattr(launch, "_THP", str(thp))
        monkeypatch.setattr(launch.sys, "platform", "linux")
        monkeypatch.setattr(launch.os, "confstr", lambda name: glibc)
        if tunables is None:
            monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
        else:
            monkeypatch.setenv("GLIBC_TUNABLES", tunables)
        return launch._huge_page_env()

    return make


def test_huge_pages_are_asked_for_only_where_they_help(host):
    assert host()["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert host(tunables="glibc.malloc.arena_max=2")["GLIBC_TUNABLES"] == \
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert host(mode="[always] madvise never") is None  # malloc gets huge pages already
    assert host(mode="always madvise [never]") is None
    assert host(glibc="glibc 2.34") is None  # no such tunable before 2.35
    assert host(glibc="musl 1.2") is None
    assert host(glibc="glibc 2.x") is None
    assert host(tunables="glibc.malloc.hugetlb=0") is None  # the user's choice stands


def _run(env):
    # `python -c CODE` re-executes as `python -c CODE`, so CODE's first line prints once per
    # process image.
    code = ("import os, sys; print('tunables', os.environ.get('GLIBC_TUNABLES'), flush=True); "
            "sys.argv[1:] = ['config', '--help']; from agentax.__main__ import main; "
            "sys.exit(main())")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_command_reexecutes_once_then_runs():
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    saved = os.environ.pop("GLIBC_TUNABLES", None)
    try:
        qualifies = launch._huge_page_env() is not None
    finally:
        if saved is not None:
            os.environ["GLIBC_TUNABLES"] = saved
    if not qualifies:
        pytest.skip("this host has no glibc >= 2.35 with THP in madvise mode: nothing to re-exec")
    out = _run(env)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("tunables")]
    assert lines == ["tunables None", "tunables glibc.malloc.hugetlb=1"]
    assert "usage: agentax config" in out.stdout

    out = _run({**env, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})  # opted out: no re-exec
    assert out.returncode == 0, out.stderr
    assert [line for line in out.stdout.splitlines() if line.startswith("tunables")] == \
        ["tunables glibc.malloc.hugetlb=0"]
