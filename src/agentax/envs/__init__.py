"""agentax.envs: environments behind one small async API (reset / step / close).

Subclass `Environment` and write `_reset` / `_step`; the base class adds step limits, per-call
timeouts and typed failures (`EnvError`). See docs/environments.md.
"""

from agentax.envs._base import EnvError, Environment, ensure_async_env
from agentax.envs._gym import (
    FROZEN_LAKE_ACTIONS,
    TAXI_ACTIONS,
    GymnasiumEnvironment,
    format_frozen_lake,
    format_taxi,
    make_frozen_lake,
    make_taxi,
    parse_frozen_lake_action,
    parse_taxi_action,
)
from agentax.envs._task import TaskEnvironment

__all__ = [
    "FROZEN_LAKE_ACTIONS",
    "TAXI_ACTIONS",
    "EnvError",
    "Environment",
    "GymnasiumEnvironment",
    "TaskEnvironment",
    "ensure_async_env",
    "format_frozen_lake",
    "format_taxi",
    "make_frozen_lake",
    "make_taxi",
    "parse_frozen_lake_action",
    "parse_taxi_action",
]
