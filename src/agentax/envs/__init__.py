"""agentax.envs: environments behind one small async API (reset / step / close).

Subclass `Environment` and write `_reset` / `_step`; the base class adds step limits, per-call
timeouts and typed failures (`EnvError`). Built-ins: `TaskEnvironment` (single turn),
`ToolEnvironment` (tool calls -> tool results -> scored answer), `CodeEnvironment` (sandboxed
python/bash), `SWEEnvironment` (fix a repository until its tests pass), and
`GymnasiumEnvironment` (any Gymnasium env, with FrozenLake and Taxi ready-made).
See docs/environments.md.
"""

from agentax.envs._base import EnvError, Environment, ensure_async_env
from agentax.envs._code import CodeEnvironment
from agentax.envs._gym import GymnasiumEnvironment, make_frozen_lake, make_taxi
from agentax.envs._reward import compute_reward
from agentax.envs._swe import SWE_REPOS, SWEEnvironment, swe_tasks
from agentax.envs._task import TaskEnvironment
from agentax.envs._tool import ToolEnvironment

__all__ = [
    "SWE_REPOS",
    "CodeEnvironment",
    "EnvError",
    "Environment",
    "GymnasiumEnvironment",
    "SWEEnvironment",
    "TaskEnvironment",
    "ToolEnvironment",
    "compute_reward",
    "ensure_async_env",
    "make_frozen_lake",
    "make_taxi",
    "swe_tasks",
]
