"""Tools a model can call: typed-function tools, a registry, a safe calculator, a confined
code sandbox (python/bash, repository helpers) built on Linux namespaces via bubblewrap, and
the tools of MCP servers (stdio subprocesses or streamable HTTP).

Every `Tool.call` is bounded by a timeout and never raises into the caller: failures come back
as `ToolResult(ok=False, error=<kind>, content=<message for the model>)`.
"""

from agentax.tools._calculator import calculator
from agentax.tools._mcp import (
    MCPConnection,
    MCPServerSpec,
    MCPUnavailableError,
    close_mcp_connections,
    mcp_connection,
    mcp_server_specs,
    mcp_tools,
    mcp_tools_sync,
)
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
    "MCPConnection",
    "MCPServerSpec",
    "MCPUnavailableError",
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
    "close_mcp_connections",
    "mcp_connection",
    "mcp_server_specs",
    "mcp_tools",
    "mcp_tools_sync",
    "python_tool",
    "repo_tools",
    "tool",
    "truncate_output",
]
