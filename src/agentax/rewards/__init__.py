"""Reward functions: `(task, response) -> float`, sync or async (call them via `call_reward`).

Built-ins, also available by name through `get_reward`: "exact_match", "math_verify",
"code_tests" (fraction of unit tests passed in the sandbox) and "code_tests_all" (1 only if all
pass). `weighted` combines rewards; `register_reward` adds your own.
"""

import functools

from agentax.rewards._code import code_tests_reward
from agentax.rewards._match import exact_match
from agentax.rewards._math import math_verify
from agentax.rewards._registry import Reward, call_reward, get_reward, register_reward, reward_names, weighted

__all__ = [
    "Reward",
    "call_reward",
    "code_tests_reward",
    "exact_match",
    "get_reward",
    "math_verify",
    "register_reward",
    "reward_names",
    "weighted",
]

register_reward("exact_match", exact_match)
register_reward("math_verify", math_verify)


def _lazy_code_tests(mode: str):
    # Built on first use so importing agentax.rewards never probes the sandbox.
    @functools.cache
    def build():
        return code_tests_reward(mode=mode)  # type: ignore[arg-type]

    async def reward(task, response):
        return await call_reward(build(), task, response)

    reward.__name__ = "code_tests" if mode == "fraction" else "code_tests_all"
    return reward


register_reward("code_tests", _lazy_code_tests("fraction"))
register_reward("code_tests_all", _lazy_code_tests("all"))
