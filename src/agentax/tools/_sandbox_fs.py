"""Host-side access to the files of a sandbox's workdir that sandboxed code cannot redirect.

Threat model: the host (often root) reads, writes, lists, renames and deletes files in a
sandbox's workdir while code in that sandbox runs. That code can rename, delete or replace any
entry of its workdir at any moment -- e.g. swap a directory for a symlink to a host folder, or
to /proc/self/root, between the host's check of a path and its use of it. A check by name
(`realpath`, then open the name again) is therefore worthless: the host must never resolve a
workdir path by name.

How it is enforced here: `WorkdirFS` opens the workdir once, as a directory file descriptor,
when the sandbox is made (before any sandboxed code runs). Every operation walks its path from
a duplicate of that descriptor one component at a time with `openat(O_DIRECTORY | O_NOFOLLOW)`,
so the kernel refuses a symlink at every step atomically with the open; the last component is
opened (or unlinked, renamed, stat'ed) relative to its parent's descriptor, again without
following a link, and a file's type is checked with `fstat` on the open descriptor, not on the
name. Consequences:

* symlinks are never followed by host-side file helpers, not even ones that stay inside the
  workdir (a sandboxed program, e.g. `bash`, still follows them inside its own confinement);
* ".." is resolved lexically before the walk (sound, since no link is followed) and cannot
  climb above the workdir; absolute paths are accepted only under /workspace;
* a write refuses a name that is a link; it creates a fresh file (`O_CREAT | O_EXCL`) in the
  parent's descriptor and renames it onto the name, so a symlink or hard link planted at the
  name after that check is replaced, never written through (a hard link to a host file cannot be made anyway: the workdir is its own mount);
* listing and copying out enter each directory by `openat(O_DIRECTORY | O_NOFOLLOW)` on its
  parent's descriptor (an entry swapped for a link in between is skipped; O_DIRECTORY refuses a
  device or FIFO before it is opened); deleting a tree uses `shutil.rmtree(dir_fd=...)`, which
  never follows links.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from agentax.tools._isolation import SANDBOX_WORKDIR

__all__ = ["WorkdirFS", "SandboxPathError", "SANDBOX_PREFIX"]

SANDBOX_PREFIX = SANDBOX_WORKDIR
"""Where sandboxed code sees the workdir; such absolute paths are taken as workdir paths."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SandboxPathError(ValueError):
    """A path given to a sandbox file helper is outside the workdir, missing, a link, or not a file."""


def split(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The components of `path` below the workdir, '.' and '..' resolved lexically.

    Raises:
        SandboxPathError: the path leaves the workdir or is not a usable name.
    """
    p = os.fspath(path)
    if "\0" in p:
        raise SandboxPathError(f"path {path!r} contains a NUL byte")
    if p == SANDBOX_PREFIX or p.startswith(SANDBOX_PREFIX + "/"):
        p = p[len(SANDBOX_PREFIX):]
    elif p.startswith("/"):
        raise SandboxPathError(f"path {path!r} is outside the working directory")
    parts: list[str] = []
    for part in p.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise SandboxPathError(f"path {path!r} is outside the working directory")
            parts.pop()
        else:
            parts.append(part)
    return tuple(parts)


def _error(path: str, e: OSError) -> SandboxPathError:
    reason = {
        errno.ENOENT: "no such file or directory",
        errno.ELOOP: "a symbolic link is on the way (file helpers do not follow links; use bash)",
        errno.ENOTDIR: "a component on the way is not a directory (or a link)",
        errno.EISDIR: "is a directory",
        errno.EACCES: "permission denied",
        errno.ENOTEMPTY: "directory not empty",
        errno.EEXIST: "already exists",
        errno.ENOSPC: "no space left in the sandbox (max_disk_mb)",
        errno.EXDEV: "cannot move across the sandbox's mounts",
    }.get(e.errno or 0, e.strerror or str(e))
    return SandboxPathError(f"{path}: {reason}")


class WorkdirFS:
    """Descriptor-relative file operations beneath one directory (a sandbox's workdir).

    Args:
        root: the workdir's host path; opened once here, never resolved by name again.
        uid: owner given to the files and directories created (the sandbox's uid), or None.
    """

    def __init__(self, root: str, uid: int | None = None) -> None:
        self.root = root
        self._uid = uid
        self._fd: int | None = os.open(root, _DIR)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        # A duplicate per operation: a concurrent close() cannot turn our descriptor number into
        # someone else's file.
        with self._lock:
            if self._fd is None:
                raise SandboxPathError("the sandbox is closed")
            fd = os.dup(self._fd)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _dir(self, parts: tuple[str, ...], path: str, *, create: bool = False) -> Iterator[int]:
        """A descriptor on the directory `parts` (made, owned by the sandbox, when `create`)."""
        with self._root() as root:
            fd = os.dup(root)
            try:
                for part in parts:
                    try:
                        nxt = os.open(part, _DIR, dir_fd=fd)
                    except FileNotFoundError:
                        if not create:
                            raise
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(part, 0o755, dir_fd=fd)
                        nxt = os.open(part, _DIR, dir_fd=fd)
                        if self._uid is not None:
                            os.fchown(nxt, self._uid, self._uid)
                    os.close(fd)
                    fd = nxt
            except OSError as e:
                os.close(fd)
                raise _error(path, e) from None
            try:
                yield fd
            finally:
                os.close(fd)

    def _parent(self, path: str, *, create: bool = False):
        parts = split(path)
        if not parts:
            raise SandboxPathError(f"{path!r} is the working directory itself; give a file name")
        return self._dir(parts[:-1], path, create=create), parts[-1]

    # ------------------------------------------------------------------ operations

    def check(self, path: str) -> Path:
        """Host path of `path` after checking that every directory on the way is a real one.

        For messages and for programs run INSIDE the sandbox only: opening the returned name on
        the host would resolve it again by name, which sandboxed code can redirect.
        """
        parts = split(path)
        try:
            with self._dir(parts[:-1] if parts else (), path) as d:
                if parts:
                    os.stat(parts[-1], dir_fd=d, follow_symlinks=False)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise _error(path, e) from None
        return Path(self.root, *parts)

    def read(self, path: str, max_bytes: int) -> bytes:
        """At most `max_bytes` of the regular file `path`."""
        opener, name = self._parent(path)
        with opener as d:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
            except OSError as e:
                raise _error(path, e) from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxPathError(f"{path} is not a regular file")
            return f.read(max_bytes)

    def write(self, path: str, data: bytes) -> None:
        """Creates or replaces the regular file `path` (parents made), never writing through a link."""
        opener, name = self._parent(path, create=True)
        with opener as d:
            mode = 0o644
            try:
                st = os.stat(name, dir_fd=d, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise SandboxPathError(f"{path} is a directory")
                if stat.S_ISLNK(st.st_mode):
                    raise SandboxPathError(f"{path} is a symbolic link (file helpers do not follow links; use bash)")
                if stat.S_ISREG(st.st_mode):
                    mode = stat.S_IMODE(st.st_mode)
            except FileNotFoundError:
                pass
            tmp = f".agentax-write-{secrets.token_hex(8)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=d)
            except OSError as e:
                raise _error(path, e) from None
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    os.fchmod(fd, mode)
                    if self._uid is not None:
                        os.fchown(fd, self._uid, self._uid)
                os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=d)
                raise _error(path, e) from None

    def walk(self, path: str, max_entries: int) -> list[str]:
        """Paths (relative to the workdir) of the entries under directory `path` that are not
        directories (files, links, ...); hidden directories skipped; at most `max_entries`."""
        parts = split(path)
        out: list[str] = []
        with self._dir(parts, path) as d:
            for rel, _, names in _tree(d, "", skip_hidden=True):
                for n in names:
                    out.append(os.path.join(*parts, rel, n))
                    if len(out) >= max_entries:
                        return sorted(out)
        return sorted(out)

    def remove(self, path: str) -> None:
        """Deletes the file, link or directory tree `path` (a link is removed, not followed)."""
        opener, name = self._parent(path)
        with opener as d:
            try:
                st = os.stat(name, dir_fd=d, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=d)
                else:
                    os.unlink(name, dir_fd=d)
            except OSError as e:
                raise _error(path, e) from None

    def rename(self, src: str, dst: str) -> None:
        """Moves `src` to `dst` inside the workdir (dst's parents made; a link moves as a link)."""
        s_open, s_name = self._parent(src)
        d_open, d_name = self._parent(dst, create=True)
        with s_open as sd, d_open as dd:
            try:
                os.rename(s_name, d_name, src_dir_fd=sd, dst_dir_fd=dd)
            except OSError as e:
                raise _error(f"{src} -> {dst}", e) from None

    def copy_out(self, path: str, dest: str | os.PathLike[str], *, max_bytes: int) -> int:
        """Copies the file or tree `path` to the host path `dest` (links skipped); returns bytes copied.

        Raises:
            SandboxPathError: `path` is missing, or the copy would exceed `max_bytes`.
        """
        dest = Path(dest)
        parts = split(path)
        total = 0

        def copy_file(d: int, name: str, to: Path) -> None:
            nonlocal total
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    return  # a link: not copied
                raise _error(path, e) from None
            with os.fdopen(fd, "rb") as src:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return
                with open(to, "wb") as out:
                    while chunk := src.read(1 << 20):
                        total += len(chunk)
                        if total > max_bytes:
                            raise SandboxPathError(f"{path}: more than {max_bytes} bytes to copy out")
                        out.write(chunk)

        opener, name = self._parent(path) if parts else (self._dir((), path), None)
        with opener as d:
            if name is not None:
                try:
                    st = os.stat(name, dir_fd=d, follow_symlinks=False)
                except OSError as e:
                    raise _error(path, e) from None
                if stat.S_ISLNK(st.st_mode):
                    raise SandboxPathError(f"{path} is a symbolic link (file helpers do not follow links)")
                if not stat.S_ISDIR(st.st_mode):
                    copy_file(d, name, dest)
                    return total
            with self._dir(parts, path) as top:
                for rel, bfd, names in _tree(top, "", skip_hidden=False):
                    (dest / rel).mkdir(parents=True, exist_ok=True)
                    for n in names:
                        copy_file(bfd, n, dest / rel / n)
        return total


_MAX_DEPTH = 64
"""Directories deeper than this below the walked one are not entered (a sandbox can nest
thousands, and each level holds a descriptor while it is walked)."""


def _tree(fd: int, rel: str, *, skip_hidden: bool, depth: int = 0) -> Iterator[tuple[str, int, list[str]]]:
    """(relative dir, its descriptor, names of its non-directory entries), top-down and sorted.

    A directory is entered only through `openat(O_DIRECTORY | O_NOFOLLOW)` on its descriptor, so
    an entry swapped for a link (or anything else) between listing and entering is skipped.
    """
    try:
        names = sorted(os.listdir(fd))
    except OSError:
        return
    files, subdirs = [], []
    for n in names:
        try:
            is_dir = stat.S_ISDIR(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            continue
        if not is_dir:
            files.append(n)
        elif not (skip_hidden and n.startswith(".")):
            subdirs.append(n)
    yield rel, fd, files
    if depth >= _MAX_DEPTH:
        return
    for n in subdirs:
        try:
            sub = os.open(n, _DIR, dir_fd=fd)
        except OSError:
            continue
        try:
            yield from _tree(sub, os.path.join(rel, n), skip_hidden=skip_hidden, depth=depth + 1)
        finally:
            os.close(sub)
