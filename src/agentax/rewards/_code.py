"""`code_tests_reward`: run a task's unit tests against the code in a response, in the sandbox.

Tests come from `task.meta["tests"]` (the key is configurable) in one of two forms:

* a list of Python snippets (typically `assert f(2) == 4`, MBPP/HumanEval style): each runs in
  the namespace of the solution, under a per-test time limit; reward = passed / total;
* a string holding a pytest module (it imports from `solution`): reward = passed / collected,
  read from pytest's summary line.

With `mode="all"` the reward is 1.0 only when every test passes. The solution is the last
fenced code block of the response (```python ... ```), or the whole response if it has none.

The score cannot be forged by the code it scores: the tests run in a judge process and the
solution in another one (see `_judge_program.py`); calls into the solution cross a pipe as
plain data, and the verdict line carries a secret the solution process never sees. The price:
tests compare plain values (a test that needs a class instance back, or an argument mutated in
place, fails).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from agentax.records import Task
from agentax.rewards._registry import Reward
from agentax.tools import Sandbox, SandboxConfig, check_sandbox_available

__all__ = ["extract_code", "code_tests_reward", "run_code_tests"]

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)

_JUDGE = (Path(__file__).parent / "_judge_program.py").read_text()
_SECRET_FILE = ".agentax-judge-secret"


def extract_code(response: str, *, language: str = "python") -> str:
    """The last fenced code block (preferring ones tagged `language`), else the whole text."""
    blocks = _FENCE.findall(response or "")
    if not blocks:
        return response or ""
    tagged = [code for tag, code in blocks if tag.lower() in (language, language[:2], "")]
    return (tagged or [code for _, code in blocks])[-1]


async def run_code_tests(
    code: str,
    tests: list[str] | tuple[str, ...] | str,
    *,
    config: SandboxConfig | None = None,
    files: Mapping[str, str] | None = None,
    per_test_timeout_s: float = 2.0,
) -> tuple[int, int, str]:
    """Runs `tests` against `code` (as solution.py) in a fresh sandbox.

    Returns:
        (passed, total, log) — log is the (truncated) output, useful for debugging rewards.
    """
    if not isinstance(tests, str):
        tests = [str(t) for t in tests]
        if not tests:
            return 0, 0, "no tests"
    secret = "AGENTAX-VERDICT-" + secrets.token_hex(16) + ":"
    all_files = {**dict(files or {}), "solution.py": code, _SECRET_FILE: secret}
    if isinstance(tests, str):
        all_files["test_solution.py"] = tests
    else:
        all_files["tests.json"] = json.dumps(tests)
    with Sandbox(config, files=all_files) as sandbox:
        mode = ["pytest"] if isinstance(tests, str) else []
        judge = f"import sys; sys.argv = ['judge', {float(per_test_timeout_s)!r}, *{mode!r}]\n" + _JUDGE
        r = await sandbox.run_python(judge)
        log = r.stdout + r.stderr
        found = [l for l in r.stdout.splitlines() if l.startswith(secret)]
        if not found:
            return 0, (len(tests) if not isinstance(tests, str) else 0), log
        result = json.loads(found[-1][len(secret) :])
        return int(result["passed"]), int(result["total"]), log.replace(secret, "[verdict]")


def code_tests_reward(
    *,
    mode: Literal["fraction", "all"] = "fraction",
    tests_key: str = "tests",
    files_key: str = "files",
    config: SandboxConfig | None = None,
    per_test_timeout_s: float = 2.0,
    language: str = "python",
) -> Reward:
    """Builds an async reward that runs `task.meta[tests_key]` against the response's code.

    Args:
        mode: "fraction" (passed / total) or "all" (1.0 only if every test passes).
        tests_key: key of the tests in `task.meta` (list of snippets, or a pytest module).
        files_key: key of extra files {path: text} in `task.meta` (helpers, fixtures).
        config: sandbox limits; its timeout bounds the whole test run.
        per_test_timeout_s: time limit of each snippet (list form).
        language: fence tag preferred when extracting the code block.

    Raises:
        SandboxUnavailableError: at construction, if the sandbox cannot isolate code here.
    """
    if mode not in ("fraction", "all"):
        raise ValueError(f"mode must be 'fraction' or 'all', got {mode!r}")
    config = config or SandboxConfig()
    if not config.allow_unconfined:
        check_sandbox_available(config)

    async def code_tests(task: Task, response: str) -> float:
        if tests_key not in task.meta:
            raise ValueError(f"task {task.id!r} has no meta[{tests_key!r}] with unit tests")
        passed, total, _ = await run_code_tests(
            extract_code(response, language=language), task.meta[tests_key], config=config,
            files=task.meta.get(files_key), per_test_timeout_s=per_test_timeout_s,
        )
        if total == 0:
            return 0.0
        if mode == "all":
            return 1.0 if passed == total else 0.0
        return passed / total

    return code_tests
