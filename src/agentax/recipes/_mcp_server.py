"""The mcp_tools recipe's MCP server: a lookup of secret codes, over stdio.

`python -m agentax.recipes._mcp_server` serves one tool, `code(key)`: the four-digit code of a
key such as `ab37` (two lowercase letters, two digits). Codes are a salted hash of the key, so
a model cannot work them out or guess them (1 in 10,000): it must call the tool. Any other key
is an error result. Written with the `mcp` SDK's own server API (`MCPServer`, FastMCP's
successor), exactly as a third-party server would be.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["KEY_PATTERN", "build_server", "secret_code"]

KEY_PATTERN = re.compile(r"[a-z]{2}[0-9]{2}")
"""The keys the server knows."""

_SALT = b"agentax-mcp-codes-v1:"


def secret_code(key: str) -> str:
    """The code the server answers for `key` (four digits, leading zeros kept).

    Raises:
      ValueError: `key` is not two lowercase letters and two digits.
    """
    if not KEY_PATTERN.fullmatch(key):
        raise ValueError(f"no code for key {key!r}: a key is two letters and two digits, like ab37")
    digest = hashlib.sha256(_SALT + key.encode()).digest()
    return f"{int.from_bytes(digest[:4], 'big') % 10_000:04d}"


def build_server():
    """The MCP server (`mcp.server.mcpserver.MCPServer`) with its one tool."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("agentax-codes", log_level="WARNING")

    # Text only (no output schema: a structured copy of one number would cost both sides a
    # JSON-schema check a call), and `async` (the SDK runs a sync tool on a worker thread).
    @server.tool(structured_output=False)
    async def code(key: str) -> str:
        """Looks up the code of a key."""
        try:
            return secret_code(key.strip())
        except ValueError as e:
            raise ToolError(str(e)) from None

    return server


if __name__ == "__main__":
    build_server().run()
