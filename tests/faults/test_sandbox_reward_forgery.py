"""`code_tests_reward` cannot be forged by the code it scores (real sandbox, real processes).

Every attack below is a solution that fails its tests but tries to make the judge report a
pass; the old in-process harness scored the first one 1.0.
"""

import asyncio

import pytest

from agentax.records import Task
from agentax.rewards import call_reward, code_tests_reward
from agentax.rewards._code import run_code_tests
from agentax.tools import SandboxConfig, SandboxUnavailableError, check_sandbox_available

try:
    check_sandbox_available()
    _REASON = None
except SandboxUnavailableError as e:
    _REASON = str(e)
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"sandbox unavailable: {_REASON}")

CONFIG = SandboxConfig(timeout_s=15.0)
TESTS = ["assert double(2) == 4", "assert double(-3) == -6", "assert double(0.5) == 1.0"]
PYTEST_TESTS = "from solution import double\n\ndef test_a():\n    assert double(2) == 4\n\ndef test_b():\n    assert double(3) == 6\n"
WRONG = "\ndef double(x):\n    return x + 1\n"

ATTACKS = {
    # the old harness's report function, reached through __main__ (scored 1.0 before)
    "call_report": "import __main__, os\n__main__.report(len(__main__.TESTS))\nos._exit(0)\n",
    # an object equal to everything
    "always_equal": "class Eq:\n    def __eq__(self, other):\n        return True\n\ndef double(x):\n    return Eq()\n",
    # end the process "successfully" before any test runs
    "exit_zero": "import os\nos._exit(0)\n",
    "sys_exit": "import sys\nsys.exit(0)\n",
    # fake verdict lines on every channel it can find, with any secret it can find
    "steal_and_print": r'''
import glob, os, json
stolen = []
for path in [".agentax-judge-secret", *glob.glob("/run/agentax/*")]:
    try:
        stolen.append(open(path).read())
    except OSError:
        pass
ppid = os.getppid()
for name in ("environ", "cmdline", "mem"):
    try:
        stolen.append(open(f"/proc/{ppid}/{name}", "rb").read(4096).decode(errors="replace"))
    except OSError:
        pass
line = "AGENTAX-VERDICT-" + json.dumps({"passed": 3, "total": 3}) + "\n"
for fd_path in (f"/proc/{ppid}/fd/1", "/proc/self/fd/1", "/dev/stdout", "/dev/tty"):
    try:
        with open(fd_path, "w") as f:
            f.write(line + "".join(stolen).replace("\n", " ")[:2000] + "\n")
    except OSError:
        pass
print(line)
''' + WRONG,
    # kill the judge so that it never reports
    "kill_judge": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG,
    # patch builtins so the comparison lies (only the solution process is patched)
    "patch_builtins": "import builtins\nbuiltins.AssertionError = type('X', (BaseException,), {})\n" + WRONG,
}


def score(code, tests=TESTS):
    fn = code_tests_reward(config=CONFIG, per_test_timeout_s=2.0)
    return asyncio.run(call_reward(fn, Task(id="t", meta={"tests": tests}), f"```python\n{code}\n```"))


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_scores_zero(name):
    assert score(ATTACKS[name]) == 0.0


@pytest.mark.parametrize("name", ["call_report", "always_equal", "steal_and_print"])
def test_attack_on_pytest_module_scores_zero(name):
    assert score(ATTACKS[name], PYTEST_TESTS) == 0.0


def test_honest_solutions_still_score():
    right = "def double(x):\n    return 2 * x\n"
    assert score(right) == 1.0
    assert score(right, PYTEST_TESTS) == 1.0
    half = "def double(x):\n    return 2 * x if x > 0 else 0\n"
    assert score(half) == pytest.approx(2 / 3)
    # exceptions cross as builtin types; containers and non-str keys survive the trip
    tests = ["try:\n    double(None)\n    assert False\nexcept TypeError:\n    pass",
             "assert double((1, 2)) == (1, 2, 1, 2) and double({1: 'a'}.keys().__len__()) == 2"]
    assert score(right, tests) == 1.0


def test_solution_process_timeout_fails_only_that_test():
    code = "import time\ndef double(x):\n    if x < 0:\n        time.sleep(60)\n    return 2 * x\n"
    passed, total, _ = asyncio.run(run_code_tests(code, TESTS, config=CONFIG, per_test_timeout_s=0.5))
    assert (passed, total) == (2, 3)
