"""agentax.envs: environments behind one small async API (reset / step / close).

Subclass `Environment` and write `_reset` / `_step`; the base class adds step limits, per-call
timeouts and typed failures (`EnvError`). Built-ins: `TaskEnvironment` (single turn),
`ToolEnvironment` (tool calls -> tool results -> scored answer), `CodeEnvironment` (sandboxed
python/bash), `SWEEnvironment` (fix a repository until its tests pass), `SWEBenchEnvironment`
(SWE-bench-format instances scored as SWE-bench does, on local repository snapshots), and
`GymnasiumEnvironment` (any Gymnasium env, with FrozenLake and Taxi ready-made), and
`BrowserEnvironment` (a real headless Chromium page, with MiniWoB++ and `web_tasks` sites).
See docs/environments.md.
"""

from agentax.envs._base import EnvError, Environment, ensure_async_env
from agentax.envs._browser import (BROWSER_SITES, BROWSER_SPANS, BrowserEnvironment, BrowserSite, UrlSite,
                                   register_browser_site)
from agentax.envs._browser_actions import ACTION_HELP as BROWSER_ACTION_HELP
from agentax.envs._browser_actions import BrowserAction, format_browser_action, parse_browser_action
from agentax.envs._browser_host import BrowserUnavailableError, check_browser_available, shutdown_browser
from agentax.envs._code import CodeEnvironment
from agentax.envs._gym import GymnasiumEnvironment, make_frozen_lake, make_taxi
from agentax.envs._multi import SINGLE_ROLE, MultiAgentEnvironment, RoleStep, as_multi_agent
from agentax.envs._miniwob import MINIWOB_TASKS, MiniWoBSite, miniwob_task, miniwob_tasks
from agentax.envs._process import ProcessEnvironment
from agentax.envs._reward import compute_reward
from agentax.envs._swe import SWE_REPOS, SWEEnvironment, swe_tasks
from agentax.envs._swebench import (SWEBenchEnvironment, SWEScore, evaluate_in_sandbox, parse_pytest_log, score_patch,
                                    score_patches, swebench_tasks)
from agentax.envs._swebench_data import RepoSnapshots, SWEInstance, load_swe_instances
from agentax.envs._task import TaskEnvironment
from agentax.envs._tool import ToolEnvironment
from agentax.envs._web_tasks import WebTasksSite, web_task, web_tasks

__all__ = [
    "BROWSER_ACTION_HELP",
    "BROWSER_SITES",
    "BROWSER_SPANS",
    "MINIWOB_TASKS",
    "SINGLE_ROLE",
    "MultiAgentEnvironment",
    "RoleStep",
    "as_multi_agent",
    "SWE_REPOS",
    "BrowserAction",
    "BrowserEnvironment",
    "BrowserSite",
    "BrowserUnavailableError",
    "MiniWoBSite",
    "ProcessEnvironment",
    "UrlSite",
    "WebTasksSite",
    "check_browser_available",
    "format_browser_action",
    "miniwob_task",
    "miniwob_tasks",
    "parse_browser_action",
    "register_browser_site",
    "shutdown_browser",
    "web_task",
    "web_tasks",
    "CodeEnvironment",
    "EnvError",
    "Environment",
    "GymnasiumEnvironment",
    "SWEEnvironment",
    "SWEBenchEnvironment",
    "SWEInstance",
    "SWEScore",
    "RepoSnapshots",
    "evaluate_in_sandbox",
    "load_swe_instances",
    "parse_pytest_log",
    "score_patch",
    "score_patches",
    "swebench_tasks",
    "TaskEnvironment",
    "ToolEnvironment",
    "compute_reward",
    "ensure_async_env",
    "make_frozen_lake",
    "make_taxi",
    "swe_tasks",
]
