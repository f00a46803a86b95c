"""A real MCP server for tests/tools/test_mcp.py, written with the `mcp` SDK's MCPServer.

`python mcp_test_server.py` serves over stdio; `--http PORT` over streamable HTTP on
127.0.0.1:PORT/mcp. Its tools cover what the client must handle: text and structured results,
an error result, a protocol error, a slow call, a stateful counter with its own reset, and
the process id (so that a test can kill the server).
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ImageContent, TextContent

server = MCPServer("agentax-test", log_level="ERROR")
_count = {"n": 0}


@server.tool()
def echo(text: str) -> str:
    """Returns the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def refuse(reason: str) -> str:
    """Always fails with the reason (an error result)."""
    raise ToolError(f"refused: {reason}")


@server.tool()
def protocol_error() -> str:
    """Answers with a JSON-RPC error instead of a result."""
    raise MCPError(-32602, "this request is invalid")


@server.tool()
def structured_only() -> CallToolResult:
    """A result with structured content and no text."""
    return CallToolResult(content=[], structured_content={"answer": 42, "unit": "zorb"})


@server.tool()
def picture() -> CallToolResult:
    """A result with an image and a caption."""
    return CallToolResult(content=[TextContent(text="a cat"),
                                   ImageContent(data="aGVsbG8=", mime_type="image/png")])


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleeps, then answers."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g}"


@server.tool()
def increment() -> int:
    """Adds one to the counter and returns it."""
    _count["n"] += 1
    return _count["n"]


@server.tool()
def reset_counter(start: int = 0) -> str:
    """Sets the counter."""
    _count["n"] = start
    return "ok"


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def greeting() -> str:
    """A value from the environment the server was started with."""
    return os.environ.get("AGENTAX_TEST_GREETING", "(unset)")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
