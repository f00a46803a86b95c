"""Where a sandbox's cgroup goes and what is written there, for the cgroup layouts found in
the wild (v1, v2 in a container, hybrid), on a fake cgroup tree in a temporary directory: the
real kernel files are covered by tests/faults/test_sandbox_quotas.py on whatever this host has."""

import errno
import os

import pytest

from agentax.tools import _quota


def fake_host(tmp_path, monkeypatch, mounts, own):
    lines = [f"{30 + i} 23 0:{40 + i} {root} {point} rw - {fstype} {fstype} {opts}\n"
             for i, (root, point, fstype, opts) in enumerate(mounts)]
    (tmp_path / "mountinfo").write_text("".join(lines))
    (tmp_path / "cgroup").write_text("".join(f"{i}:{c}:{p}\n" for i, (c, p) in enumerate(own)))
    monkeypatch.setattr(_quota, "_MOUNTINFO", str(tmp_path / "mountinfo"))
    monkeypatch.setattr(_quota, "_OWN_CGROUP", str(tmp_path / "cgroup"))


def read(path):
    with open(path) as f:
        return f.read()


def test_v2_container_root_enables_controllers_and_writes_limits(tmp_path, monkeypatch):
    cg = tmp_path / "cg2"
    cg.mkdir()
    (cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (cg / "cgroup.subtree_control").write_text("")
    fake_host(tmp_path, monkeypatch, [("/", str(cg), "cgroup2", "rw")], [("", "/")])
    group = _quota.create_cgroup(256, 12)
    (d,) = group.dirs
    assert group.version == "v2" and os.path.dirname(d) == str(cg)
    assert os.path.basename(d).startswith(f"{_quota.PREFIX}{os.getpid()}-")
    assert read(cg / "cgroup.subtree_control") == "+memory +pids"
    assert read(os.path.join(d, "memory.max")) == str(256 * 2**20)
    assert read(os.path.join(d, "pids.max")) == "12" and read(os.path.join(d, "memory.oom.group")) == "1"
    argv = group.enter_argv(["bwrap", "x"])
    assert argv[:2] == ["/bin/sh", "-c"] and os.path.join(d, "cgroup.procs") in argv[2] and argv[-2:] == ["bwrap", "x"]


def test_v2_without_memory_controller_is_refused_with_the_reason(tmp_path, monkeypatch):
    cg = tmp_path / "cg2"
    cg.mkdir()
    (cg / "cgroup.controllers").write_text("cpu io\n")
    fake_host(tmp_path, monkeypatch, [("/", str(cg), "cgroup2", "rw")], [("", "/")])
    with pytest.raises(OSError, match="memory"):
        _quota.create_cgroup(256, 12)


def test_v1_and_hybrid_hosts_use_the_v1_memory_and_pids_hierarchies(tmp_path, monkeypatch):
    mem, pids, unified = tmp_path / "memory", tmp_path / "pids", tmp_path / "unified"
    (mem / "job" / "7").mkdir(parents=True)
    pids.mkdir()
    unified.mkdir()
    fake_host(tmp_path, monkeypatch,
              [("/", str(mem), "cgroup", "rw,memory"), ("/", str(pids), "cgroup", "rw,pids"),
               ("/", str(unified), "cgroup2", "rw")],
              [("memory", "/job/7"), ("pids", "/"), ("", "/")])
    group = _quota.create_cgroup(100, 5)
    m, p = group.dirs
    assert group.version == "v1"
    assert os.path.dirname(m) == str(mem / "job" / "7") and os.path.dirname(p) == str(pids)
    assert read(os.path.join(m, "memory.limit_in_bytes")) == str(100 * 2**20)
    assert read(os.path.join(p, "pids.max")) == "5"


def test_no_cgroup_mount_is_refused(tmp_path, monkeypatch):
    fake_host(tmp_path, monkeypatch, [], [("", "/")])
    with pytest.raises(OSError, match="neither"):
        _quota.create_cgroup(100, 5)


def test_v2_busy_own_cgroup_falls_back_to_a_sibling(tmp_path, monkeypatch):
    parent = tmp_path / "cg2" / "user.slice"
    own = parent / "session.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    real_write = _quota._write

    def write(path, value):
        if path.endswith("cgroup.subtree_control"):  # what the kernel answers for a busy cgroup
            raise OSError(errno.EBUSY, "Device or resource busy")
        real_write(path, value)

    monkeypatch.setattr(_quota, "_write", write)
    fake_host(tmp_path, monkeypatch, [("/", str(tmp_path / "cg2"), "cgroup2", "rw")],
              [("", "/user.slice/session.scope")])
    group = _quota.create_cgroup(64, 4)
    (d,) = group.dirs
    assert os.path.dirname(d) == str(parent) and read(os.path.join(d, "pids.max")) == "4"
