"""exact_match, weighted combination, sync/async calling, and the name registry."""

import asyncio
import functools

import pytest

from agentax.records import Task
from agentax.rewards import call_reward, exact_match, get_reward, math_verify, register_reward, reward_names, weighted

TASK = Task(id="t", prompt="?", answer="Paris  France")


def test_exact_match_options():
    assert exact_match(TASK, "  paris france\n") == 1.0
    assert exact_match(TASK, "Paris") == 0.0
    strict = functools.partial(exact_match, ignore_case=False, normalize_whitespace=False)
    assert strict(TASK, "Paris  France") == 1.0 and strict(TASK, "paris  france") == 0.0
    with pytest.raises(ValueError, match="has no answer"):
        exact_match(Task(id="x"), "a")


def test_weighted_mixes_sync_and_async():
    async def length_bonus(task, response):
        await asyncio.sleep(0)
        return 1.0 if len(response) < 20 else 0.0

    w = weighted([(exact_match, 0.7), (length_bonus, 0.3)])
    assert asyncio.run(call_reward(w, TASK, "paris france")) == pytest.approx(1.0)
    assert asyncio.run(call_reward(w, TASK, "london")) == pytest.approx(0.3)
    assert asyncio.run(call_reward(w, TASK, "x" * 30)) == 0.0
    n = weighted([(exact_match, 2.0), (length_bonus, 2.0)], normalize=True)
    assert asyncio.run(call_reward(n, TASK, "london")) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        weighted([])
    with pytest.raises(ValueError):
        weighted([(exact_match, float("nan"))])


def test_call_reward_rejects_non_numbers():
    with pytest.raises(ValueError, match="not a number"):
        asyncio.run(call_reward(lambda t, r: "high", TASK, "x"))
    with pytest.raises(ValueError, match="not a finite"):
        asyncio.run(call_reward(lambda t, r: float("inf"), TASK, "x"))


def test_registry():
    assert {"exact_match", "math_verify", "code_tests", "code_tests_all"} <= set(reward_names())
    assert get_reward("math_verify") is math_verify
    with pytest.raises(KeyError, match="Did you mean 'math_verify'"):
        get_reward("math_verfy")

    def always_one(task, response):
        return 1.0

    register_reward("test_always_one", always_one)
    assert get_reward("test_always_one") is always_one
    register_reward("test_always_one", always_one)  # same function again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_always_one", lambda t, r: 0.0)
    register_reward("test_always_one", exact_match, overwrite=True)
    assert get_reward("test_always_one") is exact_match
