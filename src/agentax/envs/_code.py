"""`CodeEnvironment`: a fresh sandbox per episode with python / bash tools.

Each reset builds a new `agentax.tools.Sandbox` (confined with Linux namespaces, rlimits, a
wall-clock limit per run) with the task's files in its working directory, and offers the
sandbox's `python` and/or `bash` tools. The final answer is scored either by a plain reward
`(task, answer) -> float` or by a *sandbox check* `(sandbox, task, answer) -> float` that can
inspect the files the agent left behind or run commands. The sandbox is deleted on close and
on the next reset.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentax._aio import bounded
from agentax._executors import stage_executor
from agentax.envs._base import EnvError
from agentax.envs._reward import RewardFn
from agentax.envs._tool import ToolEnvironment
from agentax.records import Task, TrajectoryStatus
from agentax.tools import Sandbox, SandboxConfig, ToolRegistry, bash_tool, check_sandbox_available, python_tool
from agentax.trace import get_tracer, names

__all__ = ["CodeEnvironment", "SandboxCheck"]

SandboxCheck = Callable[[Sandbox, Task, str], "float | Awaitable[float]"]

_TOOL_MAKERS = {"python": python_tool, "bash": bash_tool}


class CodeEnvironment(ToolEnvironment):
    """Tool environment over a per-episode sandbox.

    Args:
      reward_fn: `(task, answer) -> float` scoring the final answer, or
      check: `(sandbox, task, answer) -> float` (sync or async) scoring with the sandbox state
        (exactly one of the two).
      tools: which sandbox tools to offer: any of "python", "bash".
      sandbox_config: limits of each sandboxed run (`SandboxConfig()` by default).
      files: files written into every episode's workdir ({relative path: content}); a task
        adds its own with `task.meta["files"]`.
      **kwargs: as `ToolEnvironment` (max_steps, max_output_chars, ...).

    Raises:
      SandboxUnavailableError: at construction, when code cannot be confined on this host (no
        bubblewrap, user namespaces disabled...), unless `sandbox_config.allow_unconfined`; one
        line saying what to install. Failing here, once, beats failing every episode.
    """

    def __init__(
        self,
        reward_fn: RewardFn | str | None = None,
        *,
        check: SandboxCheck | None = None,
        tools: Sequence[str] = ("python", "bash"),
        sandbox_config: SandboxConfig | None = None,
        files: Mapping[str, str | bytes] | None = None,
        **kwargs: Any,
    ) -> None:
        if (reward_fn is None) == (check is None):
            raise ValueError("give exactly one of reward_fn=(task, answer) or check=(sandbox, task, answer)")
        unknown = [t for t in tools if t not in _TOOL_MAKERS]
        if unknown or not tools:
            raise ValueError(f"tools must be a non-empty subset of {sorted(_TOOL_MAKERS)}, got {list(tools)}")
        self.sandbox_config = sandbox_config or SandboxConfig()
        if not self.sandbox_config.allow_unconfined:
            check_sandbox_available(self.sandbox_config)  # probed once per process, then cached
        super().__init__(None, reward_fn, **kwargs)
        self.check = check
        self.tool_names = tuple(tools)
        self.files = dict(files or {})
        self.sandbox: Sandbox | None = None

    def _episode_files(self, task: Task) -> dict[str, str | bytes]:
        return {**self.files, **dict(task.meta.get("files", {}))}

    def _new_sandbox(self, task: Task) -> Sandbox:
        return Sandbox(self.sandbox_config, files=self._episode_files(task))

    def _sandbox_tools(self, sandbox: Sandbox) -> list[Any]:
        return [_TOOL_MAKERS[name](sandbox) for name in self.tool_names]

    async def _make_tools(self, task: Task) -> ToolRegistry:
        self._drop_sandbox()
        # Creating a sandbox probes isolation and copies files: keep it off the event loop.
        self.sandbox = await asyncio.get_running_loop().run_in_executor(stage_executor("env"), self._new_sandbox, task)
        return ToolRegistry(self._sandbox_tools(self.sandbox))

    async def _score(self, task: Task, answer: str) -> float:
        if self.check is None:
            return await super()._score(task, answer)
        assert self.sandbox is not None
        try:
            with get_tracer().span(names.REWARD, args={"reward": getattr(self.check, "__name__", "check")}):
                value = self.check(self.sandbox, task, answer)
                if inspect.isawaitable(value):
                    value = await bounded(value, self.reward_timeout_s)
            return float(value)
        except Exception as e:  # noqa: BLE001
            raise EnvError(
                f"sandbox check raised {type(e).__name__}: {e}",
                status=TrajectoryStatus.REWARD_ERROR,
                kind="reward_error",
                call="step",
            ) from e

    def _drop_sandbox(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None

    async def _close(self) -> None:
        self._drop_sandbox()
        await super()._close()  # an MCP server session of this environment's own, if any
