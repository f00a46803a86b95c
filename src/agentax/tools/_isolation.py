"""How a sandboxed command is confined: the bubblewrap + setpriv + prlimit command line.

The command runs under bubblewrap (`bwrap`) in fresh network, pid, ipc, uts (and, when not
root, user) namespaces, with a root made of read-only binds of the system dirs (/usr, /etc,
/opt, the Python prefix), a private writable /tmp and /workspace, and the root remounted
read-only. When agentax runs as root, the sandboxed program additionally drops to a private
unprivileged uid with no capabilities (`setpriv`), so that the read-only mounts cannot be
undone and RLIMIT_NPROC is really enforced (the kernel never applies it to uid 0). Resource
limits are applied with `prlimit` inside the sandbox, just before the program starts.

`probe()` starts a trivial sandbox once per configuration and says why isolation is impossible
when it is (missing binaries, user namespaces disabled...).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["SANDBOX_WORKDIR", "confined_command", "unconfined_command", "probe", "python_ro_paths"]

SANDBOX_WORKDIR = "/workspace"
"""Path of the working directory as the sandboxed program sees it."""
SANDBOX_SCRIPTS = "/run/agentax"
"""Read-only directory holding the programs `run_python` starts."""

_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_DIRS = ("/usr", "/etc", "/opt")


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
) -> list[str]:
    """The full command line that runs `argv` inside the sandbox.

    Args:
        host_scripts: a host directory mounted read-only at SANDBOX_SCRIPTS, if given.
        sandbox_uid: uid the program drops to (only when agentax runs as root), else None.
        limits: keyword arguments of the rlimits (cpu_s, memory_mb, max_processes, ...).
    """
    cmd = ["bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
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
