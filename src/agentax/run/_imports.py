"""User code named in a config: `"package.module:callable"` strings and `run.imports`.

A run config names the environment, agent, tasks, demonstrations and reward by import path,
so a researcher's own package plugs in without touching agentax. Everything is resolved (and
each factory called once and type-checked) before any model is built or kernel compiled, and
every failure is one line that names the config field and what to fix.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agentax.config import ConfigError

__all__ = ["import_modules", "is_import_path", "resolve_callable"]


def is_import_path(text: str) -> bool:
    """True for `"package.module:attribute"` (the form factories are named in)."""
    module, sep, attr = text.partition(":")
    return bool(sep and module and attr)


def import_modules(modules: Any, *, field: str = "run.imports") -> None:
    """Imports each module (for its side effects: `register_advantage`, `register_reward`)."""
    for name in modules or ():
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
            raise ConfigError(f"{field}: cannot import {name!r} ({type(e).__name__}: {e}); "
                              "is its package installed or on PYTHONPATH?") from None


def resolve_callable(path: str, *, field: str) -> Callable[..., Any]:
    """The callable named by `"package.module:attribute"` (dots after ':' walk attributes).

    Raises:
      ConfigError: the path is malformed, the module cannot be imported, the attribute is
        missing, or it is not callable — one line naming `field`.
    """
    if not isinstance(path, str) or not is_import_path(path):
        raise ConfigError(f"{field}={path!r} must name a callable as 'package.module:function' "
                          "(e.g. agentax.envs:TaskEnvironment)")
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise ConfigError(f"{field}: cannot import module {module_name!r} ({type(e).__name__}: "
                          f"{e}); is its package installed or on PYTHONPATH?") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{field}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{field}: {path} is a {type(obj).__name__}, not a callable")
    return obj
