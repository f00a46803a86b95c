"""`SWEEnvironment`: fix a bug in a small Python repository; reward when its tests pass.

Each episode copies a repository into a fresh sandbox and offers the tools team's repository
tools (list_files, read_file, search, write_file, replace_in_file, run_tests). When the agent
answers without a tool call, the environment runs the test command in the sandbox: reward 1.0
if every test passes, else 0.0 (`info` keeps the tail of the test output).

Repositories: the three built-in ones (`SWE_REPOS`: textstats, intervals, roman; see
`swe_tasks()`), `task.meta["files"]` ({path: content}), or `task.meta["repo_dir"]` (a host
directory, copied, never modified).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

from agentax.envs._code import CodeEnvironment
from agentax.envs._swe_repos import SWE_REPOS
from agentax.records import StepResult, Task
from agentax.tools import Sandbox, SandboxConfig, repo_tools

__all__ = ["SWE_REPOS", "SWEEnvironment", "swe_tasks"]

DEFAULT_TEST_COMMAND = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -x --no-header -p no:cacheprovider"


def swe_tasks(names: Sequence[str] | None = None) -> list[Task]:
    """Tasks for the built-in repositories (all by default), in a stable order."""
    chosen = list(SWE_REPOS) if names is None else list(names)
    unknown = [n for n in chosen if n not in SWE_REPOS]
    if unknown:
        raise ValueError(f"unknown SWE repositories {unknown}; built-in: {sorted(SWE_REPOS)}")
    return [
        Task(
            id=f"swe/{name}",
            prompt=(
                f"The repository in your working directory has a bug.\n\nIssue: {SWE_REPOS[name]['issue']}\n\n"
                "Find the cause, fix it with the file tools, and run the tests. Do not edit the tests. "
                "When the tests pass, reply with a one-line summary of the fix and no tool call."
            ),
            meta={"repo": name},
        )
        for name in chosen
    ]


class SWEEnvironment(CodeEnvironment):
    """Repository bug-fixing with file tools and a test-suite reward.

    Args:
      test_command: how the tests run inside the sandbox (also the `run_tests` tool).
      sandbox_config: limits of each sandboxed run; default 60 s per run.
      **kwargs: as `ToolEnvironment` (default max_steps 20).
    """

    max_steps = 20

    def __init__(
        self,
        *,
        test_command: str = DEFAULT_TEST_COMMAND,
        sandbox_config: SandboxConfig | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            check=self._tests_pass,
            tools=("bash",),  # replaced by the repository tools below
            sandbox_config=sandbox_config or SandboxConfig(timeout_s=60.0, cpu_time_s=60),
            **kwargs,
        )
        self.test_command = test_command
        self._last_test_output = ""

    @staticmethod
    def tool_schemas(test_command: str = DEFAULT_TEST_COMMAND) -> list[dict[str, Any]]:
        """Schemas of the tools every episode offers, without creating a sandbox (for agents
        built before `reset`)."""
        # repo_tools reads only `config` while building; the tools are never called here.
        stand_in = types.SimpleNamespace(config=SandboxConfig())
        return [t.schema() for t in repo_tools(stand_in, test_command=test_command)]  # type: ignore[arg-type]

    def _new_sandbox(self, task: Task) -> Sandbox:
        meta = task.meta
        if "repo_dir" in meta:
            return Sandbox(self.sandbox_config, workdir=meta["repo_dir"], files=dict(meta.get("files", {})))
        files = dict(meta.get("files", {}))
        if "repo" in meta:
            if meta["repo"] not in SWE_REPOS:
                raise ValueError(f"unknown repo {meta['repo']!r}; built-in: {sorted(SWE_REPOS)}")
            files = {**SWE_REPOS[meta["repo"]]["files"], **files}
        if not files:
            raise ValueError("an SWE task needs task.meta['repo'], ['files'] or ['repo_dir']")
        return Sandbox(self.sandbox_config, files=files)

    def _sandbox_tools(self, sandbox: Sandbox) -> list[Any]:
        return repo_tools(sandbox, test_command=self.test_command)

    async def _tests_pass(self, sandbox: Sandbox, task: Task, answer: str) -> float:
        result = await sandbox.run_bash(self.test_command)
        self._last_test_output = (result.stdout + result.stderr)[-2000:]
        return 1.0 if result.ok else 0.0

    async def _step(self, action: Any) -> StepResult:
        out = await super()._step(action)
        if out.done:
            out = StepResult(
                observation=out.observation,
                reward=out.reward,
                done=True,
                truncated=out.truncated,
                info={**out.info, "tests_passed": out.reward == 1.0, "test_output": self._last_test_output},
            )
        return out

