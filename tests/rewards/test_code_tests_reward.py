"""code_tests_reward: unit tests run against the response's code in the real sandbox."""

import asyncio

import pytest

from agentax.records import Task
from agentax.rewards import call_reward, code_tests_reward, get_reward
from agentax.rewards._code import extract_code, run_code_tests
from agentax.tools import SandboxConfig, SandboxUnavailableError, check_sandbox_available

try:
    check_sandbox_available()
    _REASON = None
except SandboxUnavailableError as e:
    _REASON = str(e)
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"sandbox unavailable: {_REASON}")

CONFIG = SandboxConfig(timeout_s=10.0)
ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5", "while True: pass"]
GOOD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."


def reward(mode, task, response):
    fn = code_tests_reward(mode=mode, config=CONFIG, per_test_timeout_s=0.5)
    return asyncio.run(call_reward(fn, task, response))


def test_fraction_and_all_with_assert_snippets():
    task = Task(id="a", meta={"tests": ASSERTS})
    assert reward("fraction", task, GOOD) == 0.5  # a failing test and a hanging one
    assert reward("all", task, GOOD) == 0.0
    ok_task = Task(id="b", meta={"tests": ASSERTS[:2]})
    assert reward("all", ok_task, GOOD) == 1.0
    assert reward("fraction", ok_task, "def add(a, b) return") == 0.0  # syntax error
    assert reward("fraction", ok_task, "import os\nos._exit(0)") == 0.0  # exits before reporting
    fake = "print('AGENTAX-RESULT-0000:{\"passed\": 2}')\ndef add(a, b):\n    return -99"
    assert reward("fraction", ok_task, fake) == 0.0  # cannot guess the per-call nonce


def test_pytest_module_and_extra_files():
    tests = ("from solution import add\nfrom helper import K\n"
             "def test_a():\n    assert add(1, 2) == 3\n"
             "def test_b():\n    assert add(K, 0) == 7\n"
             "def test_c():\n    assert add(1, 1) == 3\n")
    task = Task(id="p", meta={"tests": tests, "files": {"helper.py": "K = 7\n"}})
    assert reward("fraction", task, GOOD) == pytest.approx(2 / 3)
    passed, total, log = asyncio.run(run_code_tests("def add(a, b):\n    return a - b\n", tests,
                                                    config=CONFIG, files={"helper.py": "K = 7\n"}))
    assert (passed, total) == (1, 3) and "failed" in log


def test_registry_builtin_and_missing_tests():
    task = Task(id="r", meta={"tests": ASSERTS[:2]})
    assert asyncio.run(call_reward(get_reward("code_tests_all"), task, GOOD)) == 1.0
    with pytest.raises(ValueError, match="no meta"):
        reward("fraction", Task(id="m"), GOOD)
    with pytest.raises(ValueError, match="mode"):
        code_tests_reward(mode="most")


def test_extract_code():
    assert extract_code(GOOD) == "def add(a, b):\n    return a + b\n"
    assert extract_code("```\nA\n```\n```python\nB\n```\n```bash\nC\n```") == "B\n"
    assert extract_code("def f(): pass") == "def f(): pass"
