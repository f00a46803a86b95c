"""`Sandbox`: run untrusted Python or bash in a confined subprocess with a persistent workdir.

Every run is bounded by wall-clock time (the whole process group is killed), CPU seconds,
address space, process count, file size and open files; it has no network, sees the system
read-only, and can write only its private /workspace (persisting across the runs of one
sandbox, e.g. one episode) and /tmp. Output is read incrementally: only the head and tail of
each stream are kept, and a run that floods its output is killed, so 100 MB of output never sits
in memory. See `_isolation.py` for the mechanism. If isolation cannot be set up on this host,
construction raises `SandboxUnavailableError` (unless `allow_unconfined=True`, for trusted code).

Memory, process count and disk are bounded per sandbox, not only per process (`_quota.py`): all
processes of one sandbox share one control group (`memory_mb`, `max_processes`), and its
workdir and /tmp live on one tmpfs of `max_disk_mb`. Where the host allows neither (no cgroup
to write, no CAP_SYS_ADMIN to mount), the first sandbox logs one warning and the per-process
rlimits remain the only bound.

What sandboxed code sees (see `Sandbox._env` and `_isolation.confined_command`): the
environment variables PATH, HOME (= /workspace), TMPDIR (= /tmp), LANG, PYTHONUNBUFFERED,
PYTHONDONTWRITEBYTECODE, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS (= 1), plus
`SandboxConfig.env` -- nothing of the host's environment; read-only /usr, /etc, /opt, the Python
installation and `extra_ro_paths`; its own /proc (its processes only) and a minimal /dev; no
network interface but loopback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentax.tools import _isolation, _quota, _sandbox_fs
from agentax.tools._sandbox_fs import SandboxPathError

__all__ = [
    "SandboxConfig",
    "SandboxResult",
    "Sandbox",
    "SandboxUnavailableError",
    "SandboxPathError",
    "check_sandbox_available",
]


class SandboxUnavailableError(RuntimeError):
    """Isolation cannot be set up on this host; the message says why and what to install."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    """Limits and setup of one sandbox (all runs of a `Sandbox` share them)."""

    timeout_s: float = 10.0
    """Wall-clock limit of one run; on expiry the whole process tree is killed."""
    cpu_time_s: int = 10
    """RLIMIT_CPU of each process, in seconds."""
    memory_mb: int = 1024
    """Memory of the whole sandbox (its cgroup, files it wrote included) and the address space
    (RLIMIT_AS) of each of its processes, in MiB."""
    max_processes: int = 64
    """Processes/threads the sandbox may have at once (its cgroup's pids.max, and RLIMIT_NPROC)."""
    max_file_mb: int = 64
    """RLIMIT_FSIZE: largest file the program may write, in MiB."""
    max_disk_mb: int = 512
    """Quota of the workdir and /tmp together (a tmpfs, so it is memory too), in MiB."""
    max_open_files: int = 256
    """RLIMIT_NOFILE."""
    max_output_bytes: int = 32_000
    """Bytes kept of each of stdout and stderr (head and tail); the rest is dropped."""
    max_drain_bytes: int = 8 * 2**20
    """Total output bytes after which the run is killed (killed_reason "output_limit")."""
    python: str = sys.executable
    """Interpreter for run_python (its prefix is mounted read-only inside the sandbox)."""
    extra_ro_paths: tuple[str, ...] = ()
    """More host directories to mount read-only at the same path (datasets, tools)."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra environment variables; the host environment is never passed through."""
    allow_unconfined: bool = False
    """Trusted code only: if isolation is impossible, run with rlimits and a temp dir but no
    namespaces (no network/filesystem isolation). Off by default: the sandbox refuses instead."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_time_s", "memory_mb", "max_processes", "max_file_mb",
                     "max_disk_mb", "max_open_files", "max_output_bytes", "max_drain_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_drain_bytes < 2 * self.max_output_bytes:
            raise ValueError("SandboxConfig.max_drain_bytes must be >= 2 * max_output_bytes")
        # "/repo/examples/../.venv/bin/python" (python started by a relative path) names a
        # directory that does not exist inside the sandbox; keep symlinks (a venv's python is
        # one, and its prefix is found through it), drop the "..".
        object.__setattr__(self, "python", os.path.normpath(os.path.abspath(self.python)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxResult:
    """What one sandboxed run produced."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The program's exit status; negative -N when killed by signal N; None if never started."""
    timed_out: bool = False
    killed_reason: str | None = None
    """Why the run was killed: "timeout", "output_limit", "memory_limit" (the kernel killed a
    process of the sandbox at its memory limit), or None."""
    truncated: bool = False
    """True when output was dropped (head and tail kept, with a marker)."""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.killed_reason is None


class _Capture:
    """Keeps the first and last `limit/2` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def text(self) -> tuple[str, bool]:
        tail = bytes(self.tail[-self.tail_limit :]) if self.tail_limit else b""
        dropped = self.total - len(self.head) - len(tail)
        head = self.head.decode("utf-8", errors="replace")
        if dropped <= 0:
            return head + tail.decode("utf-8", errors="replace"), False
        marker = f"\n...[output truncated: {dropped} bytes dropped of {self.total}]...\n"
        return head + marker + tail.decode("utf-8", errors="replace"), True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _cleanup(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class _Quotas:
    """The group and the tmpfs of one sandbox, released exactly once (close or GC)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.disk = os.path.join(root, "disk")
        """The tmpfs mount point holding work/ and tmp/ (scripts/ stays outside the quota)."""
        self.mounted = False
        self.cgroup: _quota.Cgroup | None = None
        self.files: _sandbox_fs.WorkdirFS | None = None
        """The workdir's descriptor, through which the host reads and writes its files."""

    def release(self) -> None:
        if self.files is not None:
            self.files.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.mounted:
            try:
                _quota.unmount(self.disk)
            except OSError:
                pass
        _cleanup(self.root)


_WARNED: list[str] = []


def _warn_once_without_quotas(scratch: str) -> tuple[bool, bool]:
    """(group limits available, disk quota available); logs once per process when not."""
    first = "cgroup" not in _quota._REASONS
    group = _quota.group_limits_reason()
    disk = _quota.disk_quota_reason(scratch)
    if first and (group is None or disk is None):
        swept = _quota.sweep_stale()
        if swept:
            _quota.log.warning("agentax sandbox: removed %d quota(s) left by killed agentax processes", swept)
    if (group or disk) and not _WARNED:
        missing = []
        if group:
            missing.append(f"no memory/process limit per sandbox ({group})")
        if disk:
            missing.append(f"no disk quota per sandbox ({disk})")
        _WARNED.append("; ".join(missing))
        _quota.log.warning(
            "agentax sandbox: %s; each sandboxed process is still bounded by its own rlimits "
            "(memory_mb of address space, max_file_mb per file). Run as root (or with a delegated "
            "cgroup and CAP_SYS_ADMIN) for per-sandbox quotas.", _WARNED[0])
    return group is None, disk is None


def _pick_uid() -> int | None:
    """A private uid per sandbox when running as root (RLIMIT_NPROC counts per uid)."""
    if os.geteuid() != 0:
        return None
    return 200_000 + secrets.randbelow(1_000_000_000)


def check_sandbox_available(config: SandboxConfig | None = None) -> None:
    """Returns None if sandboxes can be confined here; raises SandboxUnavailableError otherwise."""
    config = config or SandboxConfig()
    ro = _isolation.python_ro_paths(config.python) + list(config.extra_ro_paths)
    scratch = tempfile.mkdtemp(prefix="agentax-probe-")
    try:
        reason = _isolation.probe(config.python, ro, _pick_uid(), scratch)
    finally:
        _cleanup(scratch)
    if reason is not None:
        raise SandboxUnavailableError(
            f"cannot isolate sandboxed code on this host: {reason}. "
            "Pass SandboxConfig(allow_unconfined=True) only for trusted code."
        )


class Sandbox:
    """A confined place to run code, with a working directory that persists across runs.

    Args:
        config: limits; `SandboxConfig()` by default.
        files: {relative path: text or bytes} written into the workdir before the first run.
        workdir: a host directory whose contents are COPIED into the workdir (never modified).

    Raises:
        SandboxUnavailableError: isolation is impossible here and allow_unconfined is False.

    Use `close()` (or `with`/`async with`) to delete the workdir; it is also removed when the
    object is garbage-collected. Concurrent runs of one sandbox share its files and limits.
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        files: Mapping[str, str | bytes] | None = None,
        workdir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.config = config or SandboxConfig()
        self._uid = _pick_uid()
        self._root = tempfile.mkdtemp(prefix=f"{_quota.PREFIX}{os.getpid()}-")
        quotas = _Quotas(self._root)
        self._finalizer = weakref.finalize(self, quotas.release)
        self._quotas = quotas
        os.makedirs(quotas.disk)
        group_ok, disk_ok = _warn_once_without_quotas(quotas.disk)
        try:
            if disk_ok:
                _quota.mount_tmpfs(quotas.disk, self.config.max_disk_mb)
                quotas.mounted = True
            if group_ok:
                quotas.cgroup = _quota.create_cgroup(self.config.memory_mb, self.config.max_processes)
        except OSError as e:
            self._finalizer()
            raise SandboxUnavailableError(f"could not set up the sandbox's quotas: {e}") from e
        self._work = os.path.join(quotas.disk, "work")
        self._tmp = os.path.join(quotas.disk, "tmp")
        self._scripts = os.path.join(self._root, "scripts")  # run_python's programs: no quota
        self._ro_paths = _isolation.python_ro_paths(self.config.python) + list(self.config.extra_ro_paths)
        reason = _isolation.probe(self.config.python, self._ro_paths, self._uid, os.path.join(self._root, "probe"))
        _cleanup(os.path.join(self._root, "probe"))
        self.confined = reason is None
        if not self.confined and not self.config.allow_unconfined:
            self._finalizer()
            raise SandboxUnavailableError(
                f"cannot isolate sandboxed code on this host: {reason}. "
                "Pass SandboxConfig(allow_unconfined=True) only for trusted code."
            )
        if workdir is not None:
            src = Path(workdir)
            if not src.is_dir():
                self._finalizer()
                raise ValueError(f"workdir {str(src)!r} is not a directory")
            shutil.copytree(src, self._work, symlinks=True)
        else:
            os.makedirs(self._work)
        os.makedirs(self._tmp)
        os.makedirs(self._scripts, mode=0o755)
        quotas.files = _sandbox_fs.WorkdirFS(self._work, self._uid)
        for rel, content in (files or {}).items():
            self.write_file(rel, content)
        self._chown_tree()

    # ------------------------------------------------------------------ lifecycle

    @property
    def workdir(self) -> Path:
        """Host path of the working directory (the program sees it as /workspace)."""
        return Path(self._work)

    @property
    def sandbox_workdir(self) -> str:
        """The working directory as the sandboxed program sees it."""
        return _isolation.SANDBOX_WORKDIR if self.confined else self._work

    def close(self) -> None:
        """Deletes the working directory; the sandbox cannot run afterwards."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def _chown_tree(self) -> None:
        if self._uid is None:
            return
        for base, dirs, names in os.walk(self._root):
            for n in [base] + [os.path.join(base, x) for x in dirs + names]:
                os.lchown(n, self._uid, self._uid)

    # ------------------------------------------------------------------ files

    def resolve(self, path: str) -> Path:
        """Host path of `path` (relative to the workdir, or under /workspace), kept inside it.

        For messages and for programs run inside the sandbox: the host never opens a workdir path
        by name (sandboxed code could swap a directory on the way for a link at any moment); use
        `read_file`, `write_file`, `list_files`, `remove`, `rename` and `copy_out`, which walk
        the path from a descriptor of the workdir without following links (`_sandbox_fs.py`).

        Raises:
            SandboxPathError: the path leaves the workdir, or a link or non-directory is on the way.
        """
        return self._fs().check(path)

    def _fs(self) -> _sandbox_fs.WorkdirFS:
        fs = self._quotas.files
        if fs is None or self.closed:
            raise SandboxPathError("the sandbox is closed")
        return fs

    def read_file(self, path: str, *, max_bytes: int = 2**20) -> str:
        """Text of a regular file in the workdir (at most `max_bytes`, decoded leniently)."""
        return self._fs().read(path, max_bytes).decode("utf-8", errors="replace")

    def read_bytes(self, path: str, *, max_bytes: int = 2**20) -> bytes:
        """Bytes of a regular file in the workdir (at most `max_bytes`)."""
        return self._fs().read(path, max_bytes)

    def write_file(self, path: str, content: str | bytes) -> Path:
        """Creates or replaces a file in the workdir (parents created); returns its host path.

        A link at `path` is refused, never written through."""
        data = content.encode() if isinstance(content, str) else bytes(content)
        if len(data) > self.config.max_file_mb * 2**20:
            raise SandboxPathError(f"content of {path} is larger than max_file_mb")
        fs = self._fs()
        fs.write(path, data)
        return Path(fs.root, *_sandbox_fs.split(path))

    def list_files(self, path: str = ".", *, max_entries: int = 1000) -> list[str]:
        """Relative paths of the files (and links) under `path` (sorted, hidden dirs skipped)."""
        return self._fs().walk(path, max_entries)

    def remove(self, path: str) -> None:
        """Deletes a file, link or directory tree of the workdir (a link is removed, not followed)."""
        self._fs().remove(path)

    def rename(self, src: str, dst: str) -> None:
        """Moves `src` to `dst` within the workdir (parents of `dst` created)."""
        self._fs().rename(src, dst)

    def copy_out(self, path: str, dest: str | os.PathLike[str], *, max_bytes: int | None = None) -> int:
        """Copies a file or directory tree of the workdir to the host path `dest` (links are not
        copied); returns the bytes copied. `max_bytes` defaults to `max_disk_mb`."""
        limit = self.config.max_disk_mb * 2**20 if max_bytes is None else max_bytes
        return self._fs().copy_out(path, dest, max_bytes=limit)

    # ------------------------------------------------------------------ running

    def _env(self) -> dict[str, str]:
        pybin = os.path.dirname(os.path.abspath(self.config.python))
        home = self.sandbox_workdir
        env = {
            "PATH": f"{pybin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "TMPDIR": "/tmp" if self.confined else self._tmp,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        env.update(self.config.env)
        return env

    def _command(self, argv: Sequence[str], seccomp: int | None = None) -> list[str]:
        c = self.config
        limits = dict(cpu_s=c.cpu_time_s, memory_mb=c.memory_mb, max_processes=c.max_processes,
                      max_file_mb=c.max_file_mb, max_open_files=c.max_open_files)
        if not self.confined:
            cmd = _isolation.unconfined_command(argv, limits=limits)
        else:
            cmd = _isolation.confined_command(
                argv, host_workdir=self._work, host_tmpdir=self._tmp, host_scripts=self._scripts,
                ro_paths=self._ro_paths,
                env=self._env(), sandbox_uid=self._uid, limits=limits, seccomp=seccomp,
            )
        group = self._quotas.cgroup
        return group.enter_argv(cmd) if group is not None else cmd

    @property
    def quotas(self) -> dict[str, bool]:
        """Which per-sandbox bounds are in force here: {"group": cgroup, "disk": tmpfs}."""
        return {"group": self._quotas.cgroup is not None, "disk": self._quotas.mounted}

    async def run(self, argv: Sequence[str], *, timeout_s: float | None = None) -> SandboxResult:
        """Runs `argv` in the sandbox (cwd = workdir). Never raises for the program's behaviour."""
        if self.closed:
            return SandboxResult(stdout="", stderr="the sandbox is closed", exit_code=None)
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        group = self._quotas.cgroup
        oom_before = group.oom_kills() if group is not None else 0
        t0 = time.monotonic()
        seccomp = _isolation.seccomp_fd() if self.confined else None
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._command(argv, seccomp),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                cwd=self._work,
                env=None if self.confined else self._env(),
                pass_fds=() if seccomp is None else (seccomp,),
            )
        except OSError as e:
            return SandboxResult(stdout="", stderr=f"could not start the sandbox: {e}", exit_code=None,
                                 elapsed_s=time.monotonic() - t0)
        finally:
            if seccomp is not None:
                os.close(seccomp)  # the child has its copy (bwrap reads it at start)
        out, err = _Capture(self.config.max_output_bytes), _Capture(self.config.max_output_bytes)
        killed: list[str] = []

        async def drain(stream: asyncio.StreamReader, cap: _Capture) -> None:
            while chunk := await stream.read(65536):
                cap.add(chunk)
                if not killed and out.total + err.total > self.config.max_drain_bytes:
                    killed.append("output_limit")
                    _kill_group(proc.pid)

        readers = asyncio.gather(drain(proc.stdout, out), drain(proc.stderr, err))  # type: ignore[arg-type]
        waiter = asyncio.gather(readers, proc.wait())
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            killed.append("timeout")
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            waiter.cancel()
            raise
        finally:
            _kill_group(proc.pid)  # the tree on timeout; stragglers of an exited program otherwise
        try:
            await asyncio.wait_for(waiter, 5.0)
        except asyncio.TimeoutError:  # a pipe held open by something we could not kill
            waiter.cancel()
        stdout, t_out = out.text()
        stderr, t_err = err.text()
        reason = killed[0] if killed else None
        if reason is None and proc.returncode != 0 and group is not None and group.oom_kills() > oom_before:
            reason = "memory_limit"
        return SandboxResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=proc.returncode,
            timed_out=reason == "timeout",
            killed_reason=reason,
            truncated=t_out or t_err or reason == "output_limit",
            elapsed_s=time.monotonic() - t0,
        )

    async def run_python(self, code: str, *, timeout_s: float | None = None) -> SandboxResult:
        """Runs Python source with the configured python (the source is saved to a private,
        read-only file outside the disk quota, so a full workdir cannot stop it from running)."""
        name = f"agentax_main_{secrets.token_hex(4)}.py"
        host = os.path.join(self._scripts, name)
        with open(host, "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(host, 0o644)
        inside = f"{_isolation.SANDBOX_SCRIPTS}/{name}" if self.confined else host
        try:
            return await self.run([self.config.python, inside], timeout_s=timeout_s)
        finally:
            try:
                os.unlink(host)
            except OSError:
                pass

    async def run_bash(self, command: str, *, timeout_s: float | None = None) -> SandboxResult:
        """Runs a bash command line (`bash -c`) in the workdir."""
        bash = shutil.which("bash") or "/bin/bash"
        return await self.run([bash, "-c", command], timeout_s=timeout_s)
