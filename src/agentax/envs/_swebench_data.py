"""SWE-bench-format instances and the repository snapshots they run on.

An instance is one row of a SWE-bench-style JSONL file (the fields of SWE-bench, SWE-Gym,
R2E-Gym and SWE-smith datasets): `instance_id`, `repo`, `base_commit` and/or a local
`snapshot`, `problem_statement`, `patch` (the gold fix), `test_patch` (the tests that check
it), `FAIL_TO_PASS` and `PASS_TO_PASS` (test ids; JSON-encoded lists as in SWE-bench, or
lists), and the optional `environment_setup` (bash run before the tests, e.g. an `export
PYTHONPATH=...`), `test_cmd` (how the tests run; pytest with `-rA` by default),
`snapshot_patch` (a diff applied to the snapshot source to make the instance's base: how a
generated task carries its bug) and `timeout_s`. Other fields of a row are kept in `extra`.

`RepoSnapshots` turns an instance into a host directory holding its repository at the base
state, without network: a local directory, a local git mirror (checked out at `base_commit`
with `git archive`), or a source archive (a `.tar.gz` / `.zip` such as a package's sdist),
plus `snapshot_patch`. Prepared snapshots are cached; each episode or scoring run copies one
into a fresh sandbox, so nothing writes to them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_SWE_TEST_CMD", "RepoSnapshots", "SWEInstance", "load_swe_instances"]

DEFAULT_SWE_TEST_CMD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest --no-header -rA --tb=no -p no:cacheprovider"
"""The test command of an instance that names none (SWE-bench's pytest command, with `-rA` so
every test's status is in the log)."""

_REQUIRED = ("instance_id", "repo", "problem_statement", "patch", "FAIL_TO_PASS", "PASS_TO_PASS")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SWEInstance:
    """One SWE-bench-format task instance (field names as in SWE-bench)."""

    instance_id: str
    """Unique name of the instance."""
    repo: str
    """Repository name ("owner/name"); `RepoSnapshots` maps it to a local source."""
    problem_statement: str
    """The issue text the agent gets."""
    patch: str
    """The gold fix, a unified diff."""
    FAIL_TO_PASS: tuple[str, ...]
    """Tests that fail at the base state and must pass after the fix."""
    PASS_TO_PASS: tuple[str, ...] = ()
    """Tests that pass at the base state and must still pass."""
    test_patch: str = ""
    """Diff adding or changing the tests that check the fix, applied before the tests run."""
    base_commit: str = ""
    """Commit of the base state, for a git mirror source."""
    snapshot: str = ""
    """A local source of the repository (directory, git mirror or archive); relative paths are
    resolved against the JSONL's folder, then `RepoSnapshots.search_dirs`."""
    snapshot_patch: str = ""
    """Diff applied to the snapshot source to make the base state (a generated task's bug)."""
    environment_setup: str = ""
    """Bash run before every test command of this instance (same shell, so exports hold)."""
    test_cmd: str = DEFAULT_SWE_TEST_CMD
    """Test command; the test files of FAIL_TO_PASS and PASS_TO_PASS are appended."""
    timeout_s: float = 300.0
    """Wall-clock limit of one evaluation's test run."""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Fields of the row that agentax does not use (hints_text, created_at, version, ...)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, where: str = "row") -> SWEInstance:
        """Builds an instance from a SWE-bench-style dict.

        Raises:
          ValueError: a required field is missing or a field has the wrong type (the message
            names the row and the field).
        """
        if not isinstance(row, Mapping):
            raise ValueError(f"{where}: an instance must be a JSON object, got {type(row).__name__}")
        missing = [k for k in _REQUIRED if k not in row]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}; a SWE-bench instance needs {list(_REQUIRED)}")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs: dict[str, Any] = {}
        for key in names & set(row):
            value = row[key]
            if key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
                value = _test_list(value, f"{where}: field {key!r}")
            elif key == "timeout_s":
                if not isinstance(value, (int, float)) or value <= 0:
                    raise ValueError(f"{where}: field 'timeout_s' must be a positive number, got {value!r}")
                value = float(value)
            elif value is None and key not in _REQUIRED:
                continue
            elif not isinstance(value, str):
                raise ValueError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
            kwargs[key] = value
        if not kwargs["instance_id"]:
            raise ValueError(f"{where}: field 'instance_id' is empty")
        if not kwargs["FAIL_TO_PASS"]:
            raise ValueError(f"{where}: FAIL_TO_PASS is empty; an instance needs a test that the fix makes pass")
        if not kwargs.get("test_cmd"):
            kwargs.pop("test_cmd", None)
        kwargs["extra"] = {k: v for k, v in row.items() if k not in names}
        return cls(**kwargs)

    def to_row(self) -> dict[str, Any]:
        """The instance as a JSON-ready dict (`from_row` reads it back)."""
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        row["FAIL_TO_PASS"] = list(self.FAIL_TO_PASS)
        row["PASS_TO_PASS"] = list(self.PASS_TO_PASS)
        return {**dict(self.extra), **row}


def _test_list(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{what} is a string but not a JSON-encoded list of test ids: {e}") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{what} must be a list of test ids (or a JSON-encoded one), got {value!r:.80}")
    return tuple(value)


def load_swe_instances(path: str | os.PathLike[str]) -> list[SWEInstance]:
    """Instances of a SWE-bench-format JSONL file (one JSON object per line).

    A relative `snapshot` that exists next to the file is made absolute.

    Raises:
      ValueError: a line is not JSON, a row is not a valid instance, or two rows share an
        `instance_id` (the message names the line and what to fix).
      FileNotFoundError: the file does not exist.
    """
    path = Path(path)
    out: list[SWEInstance] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e})") from None
            inst = SWEInstance.from_row(row, where=where)
            if inst.instance_id in seen:
                raise ValueError(f"{where}: instance_id {inst.instance_id!r} repeats line {seen[inst.instance_id]}")
            seen[inst.instance_id] = number
            if inst.snapshot and not os.path.isabs(inst.snapshot) and (path.parent / inst.snapshot).exists():
                inst = dataclasses.replace(inst, snapshot=str((path.parent / inst.snapshot).resolve()))
            out.append(inst)
    return out


class RepoSnapshots:
    """Host directories holding each instance's repository at its base state (no network).

    Args:
      sources: {repo: local path} for instances without a `snapshot`: a directory, a git
        mirror (bare or not; checked out at the instance's `base_commit`) or an archive.
      search_dirs: folders in which a relative `snapshot` is looked up (e.g. an sdist cache).
      cache_dir: where prepared snapshots are kept (default: a folder under the user's cache).
    """

    def __init__(
        self,
        sources: Mapping[str, str | os.PathLike[str]] | None = None,
        *,
        search_dirs: Sequence[str | os.PathLike[str]] = (),
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.sources = {k: Path(v) for k, v in (sources or {}).items()}
        self.search_dirs = tuple(Path(d) for d in search_dirs)
        default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentax" / "swe_snapshots"
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default

    def source(self, inst: SWEInstance) -> Path:
        """The local source of `inst`'s repository.

        Raises:
          FileNotFoundError: no source is known or it does not exist (says what to provide).
        """
        if inst.snapshot:
            candidates = [Path(inst.snapshot)] if os.path.isabs(inst.snapshot) else [
                d / inst.snapshot for d in self.search_dirs]
            for c in candidates:
                if c.exists():
                    return c
            raise FileNotFoundError(
                f"instance {inst.instance_id}: snapshot {inst.snapshot!r} not found (looked in "
                f"{[str(c) for c in candidates] or 'no search_dirs'}); fetch it (for the shipped "
                "tasks: scripts/setup.sh) or pass RepoSnapshots(search_dirs=[...])")
        if inst.repo in self.sources:
            src = self.sources[inst.repo]
            if not src.exists():
                raise FileNotFoundError(f"instance {inst.instance_id}: source {src} of repo {inst.repo} does not exist")
            return src
        raise FileNotFoundError(
            f"instance {inst.instance_id}: no snapshot of repo {inst.repo!r}; give the row a 'snapshot' "
            f"path or RepoSnapshots(sources={{{inst.repo!r}: <directory, git mirror or archive>}})")

    def path(self, inst: SWEInstance) -> Path:
        """A directory with `inst`'s repository at its base state (prepared once, then cached).

        Treat it as read-only: sandboxes copy it.

        Raises:
          FileNotFoundError: as `source`.
          ValueError: the git mirror lacks `base_commit`, the archive is unsafe or unreadable,
            or `snapshot_patch` does not apply.
        """
        src = self.source(inst)
        git = _is_git(src)
        if src.is_dir() and not git and not inst.snapshot_patch:
            return src
        if git and not inst.base_commit:
            if inst.snapshot_patch:
                raise ValueError(f"instance {inst.instance_id}: a git source with a snapshot_patch needs base_commit")
            return src
        key = hashlib.sha256("\0".join(
            [str(src.resolve()), str(src.stat().st_mtime_ns), inst.base_commit if git else "",
             inst.snapshot_patch]).encode()).hexdigest()[:20]
        target = self.cache_dir / f"{_safe(inst.repo)}-{key}"
        if target.is_dir():
            return target
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.cache_dir))
        try:
            tree = staging / "tree"
            if git:
                _git_checkout(src, inst.base_commit, tree, inst.instance_id)
            elif src.is_dir():
                shutil.copytree(src, tree, symlinks=True)
            else:
                _extract(src, tree, inst.instance_id)
            if inst.snapshot_patch:
                _apply_host(tree, inst.snapshot_patch, inst.instance_id)
            try:
                os.rename(tree, target)
            except OSError:  # another process prepared it first
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]


def _is_git(src: Path) -> bool:
    return src.is_dir() and ((src / ".git").exists() or ((src / "HEAD").is_file() and (src / "objects").is_dir()))


def _git_checkout(src: Path, commit: str, tree: Path, iid: str) -> None:
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(src), "archive", "--format=tar", commit],
                             capture_output=True, timeout=600, check=False)
    if archive.returncode != 0:
        raise ValueError(f"instance {iid}: git mirror {src} has no commit {commit!r}: "
                         f"{archive.stderr.decode(errors='replace').strip()[:300]}")
    tmp = tree.parent / "archive.tar"
    tmp.write_bytes(archive.stdout)
    _extract(tmp, tree, iid, strip=False)


def _extract(archive: Path, tree: Path, iid: str, *, strip: bool = True) -> None:
    """Unpacks a source archive (the single top folder of an sdist is stripped)."""
    tree.mkdir(exist_ok=True)
    unpack = tree.parent / "unpack"
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                for name in z.namelist():
                    if name.startswith("/") or ".." in Path(name).parts:
                        raise ValueError(f"instance {iid}: archive {archive} has an unsafe member {name!r}")
                z.extractall(unpack)
        else:
            with tarfile.open(archive) as t:
                if hasattr(tarfile, "data_filter"):
                    t.extractall(unpack, filter="data")
                else:  # Python < 3.11.4: check the members by hand
                    for m in t.getmembers():
                        if m.name.startswith("/") or ".." in Path(m.name).parts or m.issym() or m.islnk():
                            raise ValueError(f"instance {iid}: archive {archive} has an unsafe member {m.name!r}")
                    t.extractall(unpack)
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as e:
        if isinstance(e, getattr(tarfile, "FilterError", ())):
            raise ValueError(f"instance {iid}: archive {archive} has an unsafe member: {e}") from None
        raise ValueError(f"instance {iid}: cannot unpack {archive}: {e}") from None
    entries = list(unpack.iterdir()) if unpack.is_dir() else []
    root = entries[0] if strip and len(entries) == 1 and entries[0].is_dir() else unpack
    for entry in root.iterdir():
        os.rename(entry, tree / entry.name)


def _apply_host(tree: Path, diff: str, iid: str) -> None:
    """Applies a trusted diff (the instance file's own `snapshot_patch`) to a prepared tree."""
    r = subprocess.run(["patch", "--batch", "--forward", "-p1", "-d", str(tree)], input=diff.encode(),
                       capture_output=True, timeout=60, check=False)
    if r.returncode != 0:
        raise ValueError(f"instance {iid}: snapshot_patch does not apply: {r.stdout.decode(errors='replace')[-300:]}")


def patch_files(diff: str) -> list[str]:
    """Paths (relative to the repository root) that a unified diff touches, in order."""
    out: list[str] = []
    for line in diff.splitlines():
        if line.startswith(("+++ ", "--- ")):
            name = line[4:].split("\t")[0].strip()
            if name == "/dev/null":
                continue
            name = name.split("/", 1)[1] if name[:2] in ("a/", "b/") else name
            if name not in out:
                out.append(name)
    return out


def test_files(tests: Iterable[str]) -> list[str] | None:
    """The files holding pytest node ids (`path::name`), or None when a name has no file (then
    the whole suite runs)."""
    files: list[str] = []
    for t in tests:
        head = t.split("::", 1)[0]
        if "::" not in t or not head.endswith(".py"):
            return None
        if head not in files:
            files.append(head)
    return files
