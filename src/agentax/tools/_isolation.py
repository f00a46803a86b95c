"""How a sandboxed command is confined: the bubblewrap + setpriv + prlimit command line.

The command runs under bubblewrap (`bwrap`) in fresh network, pid, ipc, uts (and, when not
root, user) namespaces, with a root made of read-only binds of the system dirs (/usr, /etc,
/opt, the Python prefix), a private writable /tmp and /workspace, and the root remounted
read-only. When agentax runs as root, the sandboxed program additionally drops to a private
unprivileged uid with no capabilities (`setpriv`), so that the read-only mounts cannot be
undone and RLIMIT_NPROC is really enforced (the kernel never applies it to uid 0). Resource
limits are applied with `prlimit` inside the sandbox, just before the program starts.

No nested user namespaces: a seccomp filter (`seccomp_program`, handed to bwrap with
`--seccomp FD`) makes `unshare` and `clone` with CLONE_NEWUSER fail with EPERM, and `clone3`
with ENOSYS (its flags sit in memory a filter cannot read; libc falls back to `clone`).
Without it, sandboxed code ran `unshare -Urm`, became root of a namespace of its own and
mounted a tmpfs there: writes past `max_disk_mb` that no quota saw. x86_64 and aarch64; on
other machines no filter is installed (`seccomp_program` returns None).

`probe()` starts a trivial sandbox once per configuration and says why isolation is impossible
when it is (missing binaries, user namespaces disabled...).
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["SANDBOX_WORKDIR", "confined_command", "probe", "python_ro_paths", "seccomp_fd",
           "seccomp_program", "unconfined_command"]

SANDBOX_WORKDIR = "/workspace"
"""Path of the working directory as the sandboxed program sees it."""
SANDBOX_SCRIPTS = "/run/agentax"
"""Read-only directory holding the programs `run_python` starts."""

_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_DIRS = ("/usr", "/etc", "/opt")


# ---------------------------------------------------------------------------- seccomp

# (AUDIT_ARCH, unshare, clone, clone3) syscall numbers
_ARCHES = {"x86_64": (0xC000003E, 272, 56, 435), "aarch64": (0xC00000B7, 97, 220, 435)}
_CLONE_NEWUSER = 0x10000000
_RET_ALLOW, _RET_ERRNO, _RET_KILL = 0x7FFF0000, 0x00050000, 0x80000000
_EPERM, _ENOSYS = 1, 38
# classic BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JSET|BPF_K,
# BPF_RET|BPF_K
# BPF_JMP|BPF_JGE|BPF_K
_LD, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06
_X32_BIT = 0x40000000


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The seccomp filter (an array of `struct sock_filter`) that forbids new user namespaces,
    for this machine's architecture; None where it is not known."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit, unshare, clone, clone3 = arch
    flags = 16  # offsetof(struct seccomp_data, args[0]); the low 32 bits on little-endian
    prog = [
        (_LD, 0, 0, 4),  # seccomp_data.arch
        (_JEQ, 1, 0, audit),
        (_RET, 0, 0, _RET_KILL),  # another ABI (e.g. 32-bit calls on x86_64): refused
        (_LD, 0, 0, 0),  # seccomp_data.nr
        (_JGE, 4, 0, _X32_BIT),  # x32 numbering (nr | 0x40000000): ENOSYS
        (_JEQ, 4, 0, unshare),
        (_JEQ, 3, 0, clone),
        (_JEQ, 1, 0, clone3),
        (_RET, 0, 0, _RET_ALLOW),
        (_RET, 0, 0, _RET_ERRNO | _ENOSYS),  # clone3
        (_LD, 0, 0, flags),  # unshare / clone: their flags
        (_JSET, 0, 1, _CLONE_NEWUSER),
        (_RET, 0, 0, _RET_ERRNO | _EPERM),
        (_RET, 0, 0, _RET_ALLOW),
    ]
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def seccomp_fd() -> int | None:
    """A fresh read-only descriptor holding `seccomp_program()` (bwrap reads it to its end),
    or None where there is no program. The caller passes it to the child and closes it."""
    program = seccomp_program()
    if program is None or not hasattr(os, "memfd_create"):
        return None
    fd = os.memfd_create("agentax-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def python_ro_paths(python: str) -> list[str]:
    """Directories the interpreter needs: its venv prefix and the base installation."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    real = os.path.realpath(python)
    paths.add(os.path.dirname(os.path.dirname(real)))  # <prefix>/bin/python -> <prefix>
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(python))))
    return sorted(p for p in paths if p and os.path.isdir(p))


def _limits_argv(*, cpu_s: int, memory_mb: int, max_processes: int, max_file_mb: int, max_open_files: int) -> list[str]:
    return [
        "prlimit",
        f"--cpu={cpu_s}:{cpu_s + 1}",
        f"--as={memory_mb * 2**20}",
        f"--nproc={max_processes}",
        f"--fsize={max_file_mb * 2**20}",
        f"--nofile={max_open_files}",
        "--core=0",
        "--",
    ]


def _covered(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def confined_command(
    argv: Sequence[str],
    *,
    host_workdir: str,
    host_tmpdir: str,
    host_scripts: str | None = None,
    ro_paths: Sequence[str],
    env: Mapping[str, str],
    sandbox_uid: int | None,
    limits: Mapping[str, int],
    seccomp: int | None = None,
) -> list[str]:
    """The full command line that runs `argv` inside the sandbox.

    Args:
        host_scripts: a host directory mounted read-only at SANDBOX_SCRIPTS, if given.
        sandbox_uid: uid the program drops to (only when agentax runs as root), else None.
        limits: keyword arguments of the rlimits (cpu_s, memory_mb, max_processes, ...).
        seccomp: a descriptor holding `seccomp_program()` (passed to the child), or None.
    """
    cmd = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if seccomp is not None:
        cmd += ["--seccomp", str(seccomp)]
    if sandbox_uid is None:
        cmd += ["--unshare-user"]
    for d in _SYSTEM_DIRS:
        cmd += ["--ro-bind-try", d, d]
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            cmd += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            cmd += ["--ro-bind", link, link]
    bound: list[str] = list(_SYSTEM_DIRS) + [l for l in _SYSTEM_LINKS if os.path.exists(l)]
    made: set[str] = set()
    under_tmp: list[str] = []
    for p in sorted(set(os.path.abspath(p) for p in ro_paths)):
        if _covered(p, ["/tmp"]) and not _covered(p, bound):
            under_tmp.append(p)  # e.g. a venv in /tmp: bound after the private /tmp, on top of it
            continue
        if _covered(p, bound) or _covered(p, ["/proc", "/dev", SANDBOX_WORKDIR]):
            continue
        parts = p.strip("/").split("/")
        for i in range(1, len(parts)):  # parents get 0755 so the dropped uid can traverse them
            parent = "/" + "/".join(parts[:i])
            if parent not in made and not _covered(parent, bound):
                cmd += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        cmd += ["--ro-bind", p, p]
        bound.append(p)
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--bind", host_tmpdir, "/tmp"]
    for p in under_tmp:
        parts = p.strip("/").split("/")
        for i in range(2, len(parts)):  # /tmp itself is the private scratch dir
            parent = "/" + "/".join(parts[:i])
            if parent not in made:
                cmd += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        cmd += ["--ro-bind", p, p]
    if host_scripts is not None:
        cmd += ["--perms", "0755", "--dir", os.path.dirname(SANDBOX_SCRIPTS),
                "--ro-bind", host_scripts, SANDBOX_SCRIPTS]
    cmd += ["--bind", host_workdir, SANDBOX_WORKDIR,
            "--chdir", SANDBOX_WORKDIR,
            "--remount-ro", "/",
            "--clearenv"]
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    if sandbox_uid is not None:
        cmd += ["setpriv", f"--reuid={sandbox_uid}", f"--regid={sandbox_uid}", "--clear-groups",
                "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--"]
    return cmd + _limits_argv(**limits) + list(argv)


def unconfined_command(argv: Sequence[str], *, limits: Mapping[str, int]) -> list[str]:
    """Only rlimits, no namespaces: for trusted code on hosts without user namespaces."""
    return _limits_argv(**limits) + list(argv)


_PROBE_CACHE: dict[tuple, str | None] = {}


def probe(python: str, ro_paths: Sequence[str], sandbox_uid: int | None, scratch: str) -> str | None:
    """Starts one trivial sandbox; returns None if it worked, else the reason it did not.

    The answer is cached per (python, ro_paths, root-or-not) for the life of the process.
    """
    key = (python, tuple(ro_paths), sandbox_uid is None)
    if key in _PROBE_CACHE:
        return _PROBE_CACHE[key]
    reason: str | None = None
    need = ["bwrap", "prlimit"] + (["setpriv"] if sandbox_uid is not None else [])
    missing = [b for b in need if shutil.which(b) is None]
    if missing:
        reason = (f"missing program(s) {missing}: install bubblewrap and util-linux "
                  f"(Debian: apt-get install -y bubblewrap util-linux)")
    else:
        work, tmp = os.path.join(scratch, "w"), os.path.join(scratch, "t")
        os.makedirs(work, exist_ok=True)
        os.makedirs(tmp, exist_ok=True)
        if sandbox_uid is not None:
            for d in (scratch, work, tmp):
                os.chown(d, sandbox_uid, sandbox_uid)
        check = ("import os,socket\n"
                 "open('/workspace/probe','w').write('x')\n"
                 "try:\n open('/probe_escape','w')\n print('root-writable')\nexcept OSError:\n pass\n"
                 "print('agentax-sandbox-ok', os.getuid())")
        cmd = confined_command(
            [python, "-S", "-c", check], host_workdir=work, host_tmpdir=tmp, ro_paths=ro_paths,
            env={"PATH": "/usr/bin:/bin"}, sandbox_uid=sandbox_uid,
            limits=dict(cpu_s=10, memory_mb=1024, max_processes=64, max_file_mb=1, max_open_files=64),
        )
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            reason = f"starting bubblewrap failed: {e}"
        else:
            if "agentax-sandbox-ok" not in r.stdout or "root-writable" in r.stdout:
                err = " ".join((r.stderr or r.stdout).split())[-300:]  # one line
                reason = (f"bubblewrap could not create the sandbox (exit {r.returncode}): {err}. "
                          "User namespaces may be disabled (sysctl kernel.unprivileged_userns_clone"
                          " / user.max_user_namespaces) or the container forbids mounts.")
            elif sandbox_uid is not None and f"agentax-sandbox-ok {sandbox_uid}" not in r.stdout:
                reason = "the sandboxed program did not drop to the unprivileged uid"
    _PROBE_CACHE[key] = reason
    return reason
