"""MCP server specs: the mapping a config gives for one server, checked into an `MCPServerSpec`
(see `agentax.tools._mcp` for what a server becomes)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from agentax.tools._tool import DEFAULT_MAX_OUTPUT_CHARS

__all__ = ["MCPServerSpec", "MCPUnavailableError", "mcp_server_specs"]

_FIELDS = ("command", "args", "env", "cwd", "url", "headers", "name", "tools", "prefix",
           "timeout_s", "connect_timeout_s", "max_output_chars", "reset_tool", "reset_arguments",
           "per_episode")
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_STDERR_TAIL = 600  # characters of a stdio server's stderr quoted when it fails


class MCPUnavailableError(RuntimeError):
    """An MCP server could not be started, reached or listed (the message says why)."""


def _require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ImportError("MCP servers need the `mcp` package (version 2): pip install "
                          "'agentax[mcp]'") from None


# ----------------------------------------------------------------------------- specs


@dataclasses.dataclass(frozen=True, kw_only=True)
class MCPServerSpec:
    """One MCP server, as a config names it (`mcp_server_specs` builds these from mappings).

    Exactly one of `command` (a stdio subprocess) and `url` (streamable HTTP) is set.
    Mappings are kept as sorted (key, value) pairs so that a spec is hashable.
    """

    command: str | None = None
    """Program of a stdio server; `python` / `python3` mean `sys.executable`."""
    args: tuple[str, ...] = ()
    """Its arguments."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables of the subprocess. It also gets the MCP SDK's safe defaults
    (HOME, PATH, USER, ...) and PYTHONPATH when set, not the rest of agentax's environment."""
    cwd: str | None = None
    """Working directory of the subprocess."""
    url: str | None = None
    """Endpoint of a streamable-HTTP server (`http://host:port/mcp`)."""
    headers: tuple[tuple[str, str], ...] = ()
    """HTTP headers sent with every request (e.g. Authorization)."""
    name: str = ""
    """Name used in messages; default: the command's or the URL's."""
    tools: tuple[str, ...] | None = None
    """Only these of the server's tools (by their MCP names); None: all of them."""
    prefix: str = ""
    """Prepended to each tool's name as the model sees it."""
    timeout_s: float = 30.0
    """Wall-clock bound of one call."""
    connect_timeout_s: float = 60.0
    """Bound of starting the server, the protocol handshake and listing its tools."""
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    """Each result is cut to this many characters (head and tail kept)."""
    reset_tool: str | None = None
    """An MCP tool called at each episode's reset (a stateful server's own reset)."""
    reset_arguments: str = "{}"
    """Its arguments, as JSON text (a mapping in the config)."""
    per_episode: bool = False
    """A fresh session (for stdio: a fresh process) for each environment, closed with it,
    instead of one shared by every environment of the worker."""

    @property
    def label(self) -> str:
        """How messages name this server."""
        if self.name:
            return self.name
        if self.url:
            return self.url
        return " ".join([os.path.basename(self.command or ""), *self.args])[:80]

    @property
    def key(self) -> str:
        """What identifies the server process/session: the same key shares one connection."""
        return json.dumps([self.command, list(self.args), list(self.env), self.cwd, self.url,
                           list(self.headers)])

    def stdio_command(self) -> str:
        """The program to run (`python` resolved to this interpreter)."""
        assert self.command is not None
        return sys.executable if self.command in ("python", "python3") else self.command


def _str_pairs(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping of strings, got {type(value).__name__}")
    out = []
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise ValueError(f"{where}.{k} must be a string, got {type(v).__name__}")
        out.append((k, str(v)))
    return tuple(sorted(out))


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ValueError(f"{where} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _one_spec(raw: Any, where: str) -> MCPServerSpec:
    if isinstance(raw, MCPServerSpec):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping such as {{command: ..., args: [...]}} or "
                         f"{{url: ...}}, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a field of an MCP server; the fields are "
                         f"{', '.join(_FIELDS)}")
    command, url = raw.get("command"), raw.get("url")
    if (command is None) == (url is None):
        raise ValueError(f"{where} needs exactly one of 'command' (a stdio server) and 'url' (a "
                         "streamable-HTTP server)")
    kw: dict[str, Any] = {}
    if command is not None:
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"{where}.command must be a program name or path, got {command!r}")
        args = raw.get("args", [])
        if isinstance(args, str) or not isinstance(args, Sequence) or \
                not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in args):
            raise ValueError(f"{where}.args must be a list of strings, got {args!r}")
        kw.update(command=command, args=tuple(str(a) for a in args),
                  env=_str_pairs(raw.get("env"), f"{where}.env"))
        cwd = raw.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError(f"{where}.cwd must be a directory path, got {cwd!r}")
        kw["cwd"] = cwd
        for field in ("url", "headers"):
            if raw.get(field) is not None:
                raise ValueError(f"{where}.{field} is for HTTP servers; a stdio server has 'command'")
    else:
        if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
            raise ValueError(f"{where}.url must be an http:// or https:// URL, got {url!r}")
        kw.update(url=url, headers=_str_pairs(raw.get("headers"), f"{where}.headers"))
        for field in ("args", "env", "cwd"):
            if raw.get(field) is not None:
                raise ValueError(f"{where}.{field} is for stdio servers; an HTTP server has 'url'")
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise ValueError(f"{where}.name must be a string, got {name!r}")
    tools = raw.get("tools")
    if tools is not None:
        if isinstance(tools, str) or not isinstance(tools, Sequence) or \
                not all(isinstance(t, str) for t in tools) or not tools:
            raise ValueError(f"{where}.tools must be a non-empty list of tool names, got {tools!r}")
        tools = tuple(tools)
    prefix = raw.get("prefix", "")
    if not isinstance(prefix, str) or (prefix and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", prefix)):
        raise ValueError(f"{where}.prefix must start with a letter or _ and hold only letters, "
                         f"digits, _ . -, got {prefix!r}")
    max_chars = raw.get("max_output_chars", DEFAULT_MAX_OUTPUT_CHARS)
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 64:
        raise ValueError(f"{where}.max_output_chars must be an integer >= 64, got {max_chars!r}")
    reset_tool = raw.get("reset_tool")
    if reset_tool is not None and (not isinstance(reset_tool, str) or not reset_tool):
        raise ValueError(f"{where}.reset_tool must be the name of one of the server's tools, "
                         f"got {reset_tool!r}")
    reset_args = raw.get("reset_arguments", {})
    if not isinstance(reset_args, Mapping):
        raise ValueError(f"{where}.reset_arguments must be a mapping, got {reset_args!r}")
    if reset_args and reset_tool is None:
        raise ValueError(f"{where}.reset_arguments is set but reset_tool is not")
    per_episode = raw.get("per_episode", False)
    if not isinstance(per_episode, bool):
        raise ValueError(f"{where}.per_episode must be true or false, got {per_episode!r}")
    return MCPServerSpec(
        **kw, name=name, tools=tools, prefix=prefix,
        timeout_s=_positive(raw.get("timeout_s", 30.0), f"{where}.timeout_s"),
        connect_timeout_s=_positive(raw.get("connect_timeout_s", 60.0), f"{where}.connect_timeout_s"),
        max_output_chars=max_chars, reset_tool=reset_tool,
        reset_arguments=json.dumps(dict(reset_args), sort_keys=True), per_episode=per_episode)


def mcp_server_specs(value: Any, *, field: str = "mcp_servers") -> tuple[MCPServerSpec, ...]:
    """Checks a list of server mappings (or specs) and returns the specs.

    Raises:
      ValueError: one line naming the field at fault, e.g. `mcp_servers[0].args must be a list
        of strings`.
    """
    if value is None:
        return ()
    if isinstance(value, (Mapping, MCPServerSpec)):
        value = [value]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{field} must be a list of servers such as [{{command: ..., args: "
                         f"[...]}}] or [{{url: ...}}], got {type(value).__name__}")
    return tuple(_one_spec(raw, f"{field}[{i}]") for i, raw in enumerate(value))


# ----------------------------------------------------------------------------- results
