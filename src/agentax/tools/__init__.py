"""Tools a model can call: typed-function tools, a registry, a safe calculator, and a confined
code sandbox (python/bash, repository helpers) built on Linux namespaces via bubblewrap.

Every `Tool.call` is bounded by a timeout and never raises into the caller: failures come back
as `ToolResult(ok=False, error=<kind>, content=<message for the model>)`.
"""

from agentax.tools._calculator import calculator
from agentax.tools._registry import ToolRegistry
from agentax.tools._sandbox import (
    Sandbox,
    SandboxConfig,
    SandboxPathError,
    SandboxResult,
    SandboxUnavailableError,
    check_sandbox_available,
)
from agentax.tools._sandbox_tools import bash_tool, python_tool, repo_tools
from agentax.tools._tool import Tool, tool, truncate_output

__all__ = [
    "Sandbox",
    "SandboxConfig",
    "SandboxPathError",
    "SandboxResult",
    "SandboxUnavailableError",
    "Tool",
    "ToolRegistry",
    "bash_tool",
    "calculator",
    "check_sandbox_available",
    "python_tool",
    "repo_tools",
    "tool",
    "truncate_output",
]
