"""`code_tests_reward`: run a task's unit tests against the code in a response, in the sandbox.

Tests come from `task.meta["tests"]` (the key is configurable) in one of two forms:

* a list of Python snippets (typically `assert f(2) == 4`, MBPP/HumanEval style): each runs in
  the namespace of the solution, under a per-test time limit; reward = passed / total;
* a string holding a pytest module (it imports from `solution`): reward = passed / collected,
  read from pytest's summary line.

With `mode="all"` the reward is 1.0 only when every test passes. The solution is the last
fenced code block of the response (```python ... ```), or the whole response if it has none.
The test results are read from a line tagged with a per-call random nonce; note that code
running in the same process as the harness could in principle forge it, so treat the sandbox
as containment, not as a guarantee against adversarial reward hacking.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Literal

from agentax.records import Task
from agentax.rewards._registry import Reward
from agentax.tools import Sandbox, SandboxConfig, check_sandbox_available

__all__ = ["extract_code", "code_tests_reward", "run_code_tests"]

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)

_HARNESS = """
import json, signal, sys
MARK = {mark!r}
TESTS = json.loads({tests!r})
def _alarm(signum, frame):
    raise TimeoutError("test took too long")
signal.signal(signal.SIGALRM, _alarm)
ns = {{"__name__": "solution"}}
def report(passed, error=None):
    sys.stdout.flush()
    sys.__stdout__.write("\\n" + MARK + json.dumps({{"passed": passed, "total": len(TESTS), "error": error}}) + "\\n")
    sys.__stdout__.flush()
try:
    signal.setitimer(signal.ITIMER_REAL, {per_test!r})
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
    signal.setitimer(signal.ITIMER_REAL, 0)
except BaseException as e:
    signal.setitimer(signal.ITIMER_REAL, 0)
    report(0, "solution failed to load: " + type(e).__name__ + ": " + str(e)[:200])
    raise SystemExit(0)
passed = 0
for i, t in enumerate(TESTS):
    try:
        signal.setitimer(signal.ITIMER_REAL, {per_test!r})
        exec(compile(t, "test_%d" % i, "exec"), ns)
        passed += 1
    except BaseException as e:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
report(passed)
"""


def extract_code(response: str, *, language: str = "python") -> str:
    """The last fenced code block (preferring ones tagged `language`), else the whole text."""
    blocks = _FENCE.findall(response or "")
    if not blocks:
        return response or ""
    tagged = [code for tag, code in blocks if tag.lower() in (language, language[:2], "")]
    return (tagged or [code for _, code in blocks])[-1]


def _pytest_counts(text: str) -> tuple[int, int]:
    """(passed, total) from pytest's final summary line, (0, 0) if absent."""
    counts = {k: 0 for k in ("passed", "failed", "error", "errors", "xfailed", "xpassed")}
    lines = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|errors?)\b", l)]
    if not lines:
        return 0, 0
    for n, k in re.findall(r"(\d+) (passed|failed|errors?|xfailed|xpassed)\b", lines[-1]):
        counts[k] += int(n)
    passed = counts["passed"] + counts["xpassed"]
    total = passed + counts["failed"] + counts["error"] + counts["errors"] + counts["xfailed"]
    return passed, total


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
    all_files = {**dict(files or {}), "solution.py": code}
    with Sandbox(config, files=all_files) as sandbox:
        if isinstance(tests, str):
            sandbox.write_file("test_solution.py", tests)
            r = await sandbox.run_bash(
                "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
                f"{sandbox.config.python} -m pytest -q -p no:cacheprovider --no-header test_solution.py"
            )
            passed, total = _pytest_counts(r.stdout)
            return passed, total, r.stdout + r.stderr
        tests = [str(t) for t in tests]
        if not tests:
            return 0, 0, "no tests"
        mark = "AGENTAX-RESULT-" + secrets.token_hex(8) + ":"
        harness = _HARNESS.format(mark=mark, tests=json.dumps(tests), per_test=float(per_test_timeout_s))
        r = await sandbox.run_python(harness)
        found = [l for l in r.stdout.splitlines() if l.startswith(mark)]
        if not found:
            return 0, len(tests), r.stdout + r.stderr
        result = json.loads(found[-1][len(mark) :])
        return int(result["passed"]), len(tests), r.stdout + r.stderr


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
