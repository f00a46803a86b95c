"""Per-sandbox quotas: one control group (memory + process count) and one size-limited tmpfs.

A sandbox's limits must hold for the sandbox as a whole, not per process: rlimits alone let
five forked children each use `memory_mb`, and let a program write `max_file_mb` into as many
files as it likes. Two host mechanisms bound the group:

* **A control group** per sandbox, under the cgroup agentax itself runs in, with the memory
  limit (swap included) and the process limit. cgroup v1 (the `memory` and `pids` hierarchies)
  is used where the host mounts them, else cgroup v2: a child of agentax's cgroup when `memory`
  and `pids` are (or can be) enabled there, else a sibling under its parent (the kernel refuses
  to enable controllers in a non-root cgroup holding processes), if that is writable. Every sandboxed command starts by moving itself into the group (`sh -c 'echo $$ >
  .../cgroup.procs; exec ...'`), so all its descendants are in it before any untrusted code runs.
* **A tmpfs of `max_disk_mb`** mounted on the sandbox's directory (the workdir and /tmp both live
  in it): writes stop with ENOSPC at the quota. Files are kept in memory, so what the sandbox
  writes also counts towards its memory limit.

Both need privileges (root, or a delegated cgroup). `group_limits_reason()` / `disk_quota_reason()`
say why one is unavailable; the sandbox then warns once and keeps its per-process rlimits.

Names carry the pid of the agentax process that made them (`agentax-sandbox-<pid>-...`), so
that `sweep_stale()` can unmount and delete what a killed process left behind (a tmpfs keeps
its files in memory until it is unmounted).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import secrets
import shlex
import shutil
import signal
import time
from collections.abc import Sequence

__all__ = ["Cgroup", "PREFIX", "create_cgroup", "disk_quota_reason", "group_limits_reason", "mount_tmpfs",
           "sweep_stale", "unmount"]

log = logging.getLogger("agentax.sandbox")

_V1_CONTROLLERS = ("memory", "pids")
_MOUNTINFO, _OWN_CGROUP = "/proc/self/mountinfo", "/proc/self/cgroup"  # tests point these elsewhere
PREFIX = "agentax-sandbox-"
"""Prefix of every sandbox directory and cgroup; followed by the owner's pid and a dash."""


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fs type, super options) of every cgroup mount."""
    out = []
    with open(_MOUNTINFO) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
                out.append((fields[3], fields[4].replace("\\040", " "), rfields[0], set(rfields[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """{controller or "" (v2): path of this process's cgroup} from /proc/self/cgroup."""
    paths = {}
    with open(_OWN_CGROUP) as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _join(mount_point: str, mount_root: str, path: str) -> str | None:
    rel = os.path.relpath(path, mount_root) if mount_root != "/" else path.lstrip("/")
    if rel.startswith(".."):
        return None  # our cgroup is not visible under this mount
    return os.path.normpath(os.path.join(mount_point, rel))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _parents() -> tuple[str, list[str]]:
    """("v1" | "v2", the parent directories a sandbox cgroup is created under); raises OSError."""
    mounts, own = _mounts(), _own_paths()
    v1 = {}
    for root, point, fstype, opts in mounts:
        for c in _V1_CONTROLLERS:
            if fstype == "cgroup" and c in opts and c in own:
                d = _join(point, root, own[c])
                if d and os.path.isdir(d):
                    v1[c] = d
    if len(v1) == len(_V1_CONTROLLERS):
        return "v1", [v1[c] for c in _V1_CONTROLLERS]
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            d = _join(point, root, own[""])
            if d and os.path.isdir(d):
                with open(os.path.join(d, "cgroup.controllers")) as f:
                    available = set(f.read().split())
                missing = [c for c in _V1_CONTROLLERS if c not in available]
                if missing:
                    raise OSError(f"cgroup v2 at {d} does not offer the {missing} controller(s)")
                with open(os.path.join(d, "cgroup.subtree_control")) as f:
                    enabled = set(f.read().split())
                if set(_V1_CONTROLLERS) <= enabled:
                    return "v2", [d]
                try:
                    _write(os.path.join(d, "cgroup.subtree_control"), " ".join("+" + c for c in _V1_CONTROLLERS))
                    return "v2", [d]
                except OSError as e:
                    # A non-root cgroup holding processes cannot enable controllers for children
                    # (EBUSY); its parent offers them to it, so a sibling group gets them.
                    parent = os.path.dirname(d)
                    if d == point or not os.access(parent, os.W_OK):
                        raise OSError(f"cannot enable {list(_V1_CONTROLLERS)} under {d}: {e}") from e
                    return "v2", [parent]
    raise OSError("the host mounts neither cgroup v1 memory+pids nor a cgroup v2 hierarchy")


class Cgroup:
    """One sandbox's control group (one directory per hierarchy under v1, one under v2)."""

    def __init__(self, version: str, dirs: Sequence[str]) -> None:
        self.version = version
        self.dirs = list(dirs)

    def enter_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` prefixed by a shell that moves itself into the group, then execs it."""
        moves = " && ".join(f"echo $$ > {shlex.quote(os.path.join(d, 'cgroup.procs'))}" for d in self.dirs)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "agentax-sandbox", *argv]

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the memory limit so far."""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        try:
            with open(os.path.join(self.dirs[0], name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    out.update(int(x) for x in f.read().split())
            except OSError:
                pass
        return sorted(out)

    def kill_all(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self) -> None:
        """Kills what is left in the group and deletes it (retrying while processes exit)."""
        for attempt in range(50):
            self.kill_all()
            left = []
            for d in self.dirs:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            self.dirs = left
            if not left:
                return
            time.sleep(0.01 * (attempt + 1))
        log.warning("could not remove sandbox cgroup(s) %s", left)


def create_cgroup(memory_mb: int, max_processes: int) -> Cgroup:
    """A new group with the limits; raises OSError when the host offers none."""
    version, parents = _parents()
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    group = Cgroup(version, [])
    try:
        for p in parents:
            d = os.path.join(p, name)
            os.mkdir(d)
            group.dirs.append(d)
        limit = str(memory_mb * 2**20)
        if version == "v1":
            mem, pids = group.dirs
            _write(os.path.join(mem, "memory.limit_in_bytes"), limit)
            if os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes")):
                _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), limit)  # no swapping around it
            _write(os.path.join(pids, "pids.max"), str(max_processes))
        else:
            (d,) = group.dirs
            _write(os.path.join(d, "memory.max"), limit)
            if os.path.exists(os.path.join(d, "memory.swap.max")):
                _write(os.path.join(d, "memory.swap.max"), "0")
            _write(os.path.join(d, "memory.oom.group"), "1")
            _write(os.path.join(d, "pids.max"), str(max_processes))
    except OSError:
        group.remove()
        raise
    return group


_REASONS: dict[str, str | None] = {}


def group_limits_reason() -> str | None:
    """None if sandbox cgroups can be made here, else why not (probed once per process)."""
    if "cgroup" not in _REASONS:
        try:
            create_cgroup(64, 8).remove()
            _REASONS["cgroup"] = None
        except OSError as e:
            _REASONS["cgroup"] = f"{type(e).__name__}: {e}"
    return _REASONS["cgroup"]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_MNT_DETACH = 2
_MS_NOSUID, _MS_NODEV = 2, 4


def mount_tmpfs(path: str, size_mb: int) -> None:
    """Mounts a tmpfs of `size_mb` MiB on `path`; raises OSError (needs CAP_SYS_ADMIN)."""
    opts = f"size={size_mb * 2**20},mode=0700".encode()
    if _libc.mount(PREFIX.rstrip("-").encode(), os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting a tmpfs on {path}: {os.strerror(err)}")


def unmount(path: str) -> None:
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unmounting {path}: {os.strerror(err)}")


def disk_quota_reason(scratch: str) -> str | None:
    """None if a size-limited tmpfs can be mounted here, else why not (probed once)."""
    if "tmpfs" not in _REASONS:
        try:
            mount_tmpfs(scratch, 1)
            unmount(scratch)
            _REASONS["tmpfs"] = None
        except OSError as e:
            _REASONS["tmpfs"] = str(e)
    return _REASONS["tmpfs"]


def _owner_dead(name: str) -> bool:
    """True when `name` is PREFIX<pid>-... and no process <pid> exists."""
    if not name.startswith(PREFIX):
        return False
    pid = name[len(PREFIX):].split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def sweep_stale() -> int:
    """Unmounts / deletes the tmpfs quotas and cgroups of agentax processes that died without
    closing their sandboxes (kill -9). Returns how many it removed; never raises."""
    removed = 0
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return 0
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 2 or rfields[:2] != ["tmpfs", PREFIX.rstrip("-")]:
            continue
        point = fields[4].replace("\\040", " ")
        root = os.path.dirname(point)
        if _owner_dead(os.path.basename(root)):
            try:
                unmount(point)
                shutil.rmtree(root, ignore_errors=True)
                removed += 1
            except OSError:
                pass
    try:
        _, parents = _parents()
    except OSError:
        parents = []
    for parent in parents:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if _owner_dead(name):
                group = Cgroup("", [os.path.join(parent, name)])
                group.remove()
                removed += not group.dirs
    return removed
