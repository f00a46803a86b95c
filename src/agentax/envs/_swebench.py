"""SWE-bench scoring in the sandbox, and `SWEBenchEnvironment` over SWE-bench-format instances.

Scoring follows the SWE-bench harness: the model's patch is applied to the base state
(`git apply -v`, then `patch --batch --fuzz=5 -p1`), the test files the test patch touches are
reset to the base state and the test patch is applied, the test command runs on the test files
of FAIL_TO_PASS and PASS_TO_PASS, and each test's status is read from pytest's `-rA` summary.
A test passes when its status is PASSED or XFAIL; a test missing from the log (not collected,
its file failed to import, the run timed out) fails. The instance is resolved when every
FAIL_TO_PASS test and every PASS_TO_PASS test passes. Everything runs in an `agentax.tools.Sandbox`
with its limits; the host touches the sandbox's files only through its file API.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentax.envs._swe import SWEEnvironment
from agentax.envs._swebench_data import RepoSnapshots, SWEInstance, patch_files, test_files
from agentax.records import StepResult, Task
from agentax.tools import Sandbox, SandboxConfig, SandboxPathError, repo_tools

__all__ = ["SWEBenchEnvironment", "SWEScore", "evaluate_in_sandbox", "parse_pytest_log", "score_patch",
           "score_patches", "swebench_tasks"]

SCORING_SANDBOX = SandboxConfig(timeout_s=300.0, cpu_time_s=300, max_processes=128)
"""Limits of a scoring sandbox (each test run is further bounded by the instance's timeout_s)."""

_LOG = ".agentax_swe_test.log"
_PATCH = ".agentax_swe.diff"
_PASS = ("PASSED", "XFAIL")
_STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SWEScore:
    """The outcome of evaluating one instance."""

    instance_id: str
    resolved: bool
    """Every FAIL_TO_PASS and every PASS_TO_PASS test passed."""
    status: str
    """"resolved", "unresolved", "patch_failed" (the model's patch did not apply),
    "test_patch_failed", or "timeout" (the test run hit the instance's timeout_s)."""
    fail_to_pass: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    pass_to_pass: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    log_tail: str = ""
    """The end of the test log (or the patch tool's output)."""
    elapsed_s: float = 0.0


def parse_pytest_log(log: str) -> dict[str, str]:
    """{test id: status} from pytest's `-rA` short summary (PASSED, FAILED, ERROR, XFAIL, ...).

    A failure of a test (FAILED or ERROR, e.g. in teardown) overrides a PASSED of the same id."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        for status in _STATUSES:
            if line.startswith(status + " "):
                name = line[len(status) + 1:].strip()
                if status == "SKIPPED" and name.startswith("["):
                    break  # "SKIPPED [1] file.py:3: reason" names a location, not a test id
                name = _strip_reason(name)
                if out.get(name) in ("FAILED", "ERROR"):
                    break
                out[name] = status
                break
    return out


def _strip_reason(text: str) -> str:
    """`id - message` -> `id`, at the first " - " outside the id's [parameters]."""
    start = 0
    while (cut := text.find(" - ", start)) != -1:
        head = text[:cut]
        if head.count("[") == head.count("]"):
            return head
        start = cut + 3
    return text


def test_command(inst: SWEInstance, files: Sequence[str] | None = None) -> str:
    """The bash line that runs `inst`'s tests (its environment_setup first, same shell)."""
    cmd = inst.test_cmd + "".join(f" {shlex.quote(f)}" for f in files or ())
    return f"{inst.environment_setup}\n{cmd}" if inst.environment_setup.strip() else cmd


async def _apply(sandbox: Sandbox, diff: str, timeout_s: float) -> tuple[bool, str]:
    sandbox.write_file(_PATCH, diff if diff.endswith("\n") else diff + "\n")
    r = await sandbox.run_bash(
        f"git apply -v {_PATCH} 2>&1 || patch --batch --fuzz=5 -p1 -i {_PATCH} 2>&1", timeout_s=timeout_s)
    sandbox.remove(_PATCH)
    return r.ok, (r.stdout + r.stderr)[-2000:]


def _reset_to_base(sandbox: Sandbox, base: Path, paths: Sequence[str]) -> None:
    """Files the test patch touches go back to the base state (the agent may have edited them)."""
    for rel in paths:
        src = base / rel
        if src.is_file():
            sandbox.write_file(rel, src.read_bytes())
        else:
            try:
                sandbox.remove(rel)
            except (SandboxPathError, FileNotFoundError, OSError):
                pass


async def evaluate_in_sandbox(sandbox: Sandbox, inst: SWEInstance, base: Path, *,
                              timeout_s: float | None = None) -> SWEScore:
    """Scores the sandbox's current tree as SWE-bench does (test patch, named tests, statuses).

    Args:
      sandbox: holds the repository with the model's changes (patch applied or edits made).
      inst: the instance.
      base: the host directory of the base state (`RepoSnapshots.path`), to reset test files.
      timeout_s: limit of the test run; default `inst.timeout_s`.
    """
    t0 = time.monotonic()
    limit = inst.timeout_s if timeout_s is None else timeout_s
    if inst.test_patch.strip():
        _reset_to_base(sandbox, base, patch_files(inst.test_patch))
        ok, out = await _apply(sandbox, inst.test_patch, limit)
        if not ok:
            return SWEScore(instance_id=inst.instance_id, resolved=False, status="test_patch_failed",
                            log_tail=out, elapsed_s=time.monotonic() - t0)
    files = test_files(inst.FAIL_TO_PASS + inst.PASS_TO_PASS)
    run = await sandbox.run_bash(f"{{ {test_command(inst, files)}\n}} > {_LOG} 2>&1", timeout_s=limit)
    try:
        log = sandbox.read_file(_LOG, max_bytes=16 * 2**20)
        sandbox.remove(_LOG)
    except (SandboxPathError, FileNotFoundError, OSError) as e:
        log = f"(no test log: {e})\n{run.stdout}{run.stderr}"
    statuses = parse_pytest_log(log)
    f2p = {t: statuses.get(t) in _PASS for t in inst.FAIL_TO_PASS}
    p2p = {t: statuses.get(t) in _PASS for t in inst.PASS_TO_PASS}
    resolved = all(f2p.values()) and all(p2p.values())
    status = "resolved" if resolved else ("timeout" if run.timed_out else "unresolved")
    return SWEScore(instance_id=inst.instance_id, resolved=resolved, status=status, fail_to_pass=f2p,
                    pass_to_pass=p2p, log_tail=log[-3000:], elapsed_s=time.monotonic() - t0)


async def score_patch(inst: SWEInstance, patch: str, *, snapshots: RepoSnapshots,
                      sandbox_config: SandboxConfig | None = None, timeout_s: float | None = None) -> SWEScore:
    """Scores a model's patch for `inst` in a fresh sandbox (SWE-bench's evaluation of one prediction).

    Args:
      inst: the instance.
      patch: the model's unified diff ("" scores the base state).
      snapshots: where the repository's base state comes from.
      sandbox_config: limits of the sandbox; default `SCORING_SANDBOX`.
      timeout_s: limit of the test run; default `inst.timeout_s`.
    """
    t0 = time.monotonic()
    loop = asyncio.get_running_loop()
    base = await loop.run_in_executor(None, snapshots.path, inst)
    config = sandbox_config or SCORING_SANDBOX
    sandbox = await loop.run_in_executor(None, lambda: Sandbox(config, workdir=base))
    try:
        if patch.strip():
            ok, out = await _apply(sandbox, patch, timeout_s or inst.timeout_s)
            if not ok:
                return SWEScore(instance_id=inst.instance_id, resolved=False, status="patch_failed",
                                log_tail=out, elapsed_s=time.monotonic() - t0)
        score = await evaluate_in_sandbox(sandbox, inst, base, timeout_s=timeout_s)
        return dataclasses.replace(score, elapsed_s=time.monotonic() - t0)
    finally:
        sandbox.close()


async def score_patches(items: Sequence[tuple[SWEInstance, str]], *, snapshots: RepoSnapshots,
                        concurrency: int = 4, **kwargs: Any) -> list[SWEScore]:
    """`score_patch` for many (instance, patch) pairs, `concurrency` sandboxes at a time, in order."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(inst: SWEInstance, patch: str) -> SWEScore:
        async with gate:
            return await score_patch(inst, patch, snapshots=snapshots, **kwargs)

    return list(await asyncio.gather(*(one(i, p) for i, p in items)))


INSTRUCTIONS = (
    "Resolve the issue below in the repository in your working directory. Find the cause, fix the "
    "code with the file tools and run the tests. Do not edit the tests. When you are done, reply "
    "with a one-line summary of the fix and no tool call."
)


def swebench_tasks(instances: Sequence[SWEInstance], *, instructions: str = INSTRUCTIONS) -> list[Task]:
    """One task per instance (prompt: the instructions and the problem statement)."""
    return [
        Task(id=f"swebench/{inst.instance_id}",
             prompt=f"{instructions}\n\n<issue>\n{inst.problem_statement.strip()}\n</issue>" if instructions
             else inst.problem_statement,
             meta={"swe_instance": inst.to_row()})
        for inst in instances
    ]


def task_instance(task: Task) -> SWEInstance:
    """The instance a task of `swebench_tasks` carries."""
    row = task.meta.get("swe_instance")
    if row is None:
        raise ValueError(f"task {task.id} has no meta['swe_instance']; make tasks with swebench_tasks()")
    return row if isinstance(row, SWEInstance) else SWEInstance.from_row(row, where=f"task {task.id}")


class SWEBenchEnvironment(SWEEnvironment):
    """SWE-bench-format instances: the repository at its base state, the repository tools, and
    SWE-bench's resolved check as the reward (1.0 resolved, else 0.0).

    The agent edits the sandbox's copy of the snapshot; when it answers, the test patch is
    applied to its tree and the named tests run (`evaluate_in_sandbox`). `run_tests` runs the
    instance's own test command (without the hidden test patch).

    Args:
      snapshots: where repositories come from; default `RepoSnapshots()` (a row's own snapshot).
      sandbox_config: limits of each sandboxed run; default 60 s per run.
      **kwargs: as `ToolEnvironment` (default max_steps 20).
    """

    def __init__(self, *, snapshots: RepoSnapshots | None = None, sandbox_config: SandboxConfig | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("reward_timeout_s", 900.0)
        super().__init__(sandbox_config=sandbox_config, **kwargs)
        self.check = self._resolved
        self.snapshots = snapshots or RepoSnapshots()
        self._instance: SWEInstance | None = None
        self._base: Path | None = None
        self._last_score: SWEScore | None = None

    def _new_sandbox(self, task: Task) -> Sandbox:
        inst = task_instance(task)
        base = self.snapshots.path(inst)
        self._instance, self._base, self._last_score = inst, base, None
        return Sandbox(self.sandbox_config, workdir=base)

    def _sandbox_tools(self, sandbox: Sandbox) -> list[Any]:
        assert self._instance is not None
        return repo_tools(sandbox, test_command=test_command(self._instance))

    async def _resolved(self, sandbox: Sandbox, task: Task, answer: str) -> float:
        assert self._instance is not None and self._base is not None
        self._last_score = await evaluate_in_sandbox(sandbox, self._instance, self._base)
        self._last_test_output = self._last_score.log_tail[-2000:]
        return 1.0 if self._last_score.resolved else 0.0

    async def _step(self, action: Any) -> StepResult:
        out = await super()._step(action)
        if out.done and self._last_score is not None:
            s = self._last_score
            out = dataclasses.replace(out, info={
                **out.info, "resolved": s.resolved, "swe_status": s.status,
                "fail_to_pass_passed": sum(s.fail_to_pass.values()), "fail_to_pass": len(s.fail_to_pass)})
        return out
