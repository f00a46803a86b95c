"""MCP servers as tools: the tools of any Model Context Protocol server, called like native ones.

A server is named by a spec, the same mapping a config file gives (`env.kwargs.mcp_servers`):

* `{command: python, args: [-m, my_server], env: {...}, cwd: ...}`: a stdio server, started as
  a subprocess (`python` and `python3` run the interpreter agentax itself runs on);
* `{url: http://host:port/mcp, headers: {...}}`: a streamable-HTTP server already running.

Optional fields: `name` (how messages call it), `tools` (only these of its tools), `prefix`
(prepended to each tool's name, to keep two servers' tools apart), `timeout_s` (one call),
`connect_timeout_s` (start, handshake and listing), `max_output_chars`, `reset_tool` and
`reset_arguments` (a tool called at each episode's reset, for stateful servers), and
`per_episode: true` (a fresh server session for each environment, closed with it).

`mcp_tools(specs)` lists each server's tools with their JSON schemas and returns them as
agentax `Tool`s, so an agent offers them through the chat template's `tools` exactly like
native ones; `mcp_tools_sync` does the same outside a coroutine (an agent factory). Calling one
never raises into the episode: the server's text and structured content become the
`ToolResult`'s content, a result flagged `isError` comes back with `ok=False, error="tool_error"`,
a protocol error with `"protocol_error"`, no answer within `timeout_s` with `"timeout"`, a
server that died with `"server_died"` (the next call starts it again) and one that cannot be
reached with `"unavailable"`.

One connection per server spec and event loop (`mcp_connection(spec)`) is shared by every
environment on that loop and reused across episodes: a stdio server is one process per
environment worker, not one per episode. The MCP SDK is built on anyio task groups, which must
be entered and left by one task, so each connection runs its session in one long-lived
background task that owns the SDK's `async with` contexts; calls reach it through a queue and
come back as futures, each run (with its timeout) inside that task's own task group. The task,
and the server process with it, ends when the loop's tasks are cancelled at its end
(`asyncio.run`, `Pipeline.run`) or at `close()`.

Needs the `mcp` package (`pip install 'agentax[mcp]'`), imported only when a server is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from agentax.records import ToolResult
from agentax.tools._tool import Tool

__all__ = [
    "MCPConnection",
    "MCPServerSpec",
    "MCPUnavailableError",
    "close_mcp_connections",
    "mcp_connection",
    "mcp_server_specs",
    "mcp_tools",
    "mcp_tools_sync",
]

from agentax.tools._mcp_spec import (
    _STDERR_TAIL,
    _TOOL_NAME,
    MCPServerSpec,
    MCPUnavailableError,
    _one_spec,
    _require_mcp,
    mcp_server_specs,
)

def _content_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}]"
    if kind == "resource_link":
        return f"[resource: {block.uri}]"
    if kind == "resource":
        res = block.resource
        text = getattr(res, "text", None)
        return text if text is not None else f"[resource: {res.uri} ({res.mime_type or 'binary'})]"
    return f"[{kind or type(block).__name__}]"


def result_text(result: Any) -> str:
    """The text a model reads from an MCP `CallToolResult`: its content blocks (text as is,
    others as a bracketed note), or its structured content as JSON when it has no text."""
    text = "\n".join(_content_text(b) for b in (result.content or []))
    if not text.strip() and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return text


def _error_text(text: str) -> str:
    return text if text.lower().startswith("error") else f"Error: {text}"


# ----------------------------------------------------------------------------- one session


class _Job:
    __slots__ = ("name", "arguments", "timeout_s", "future", "scope")

    def __init__(self, name: str, arguments: dict[str, Any], timeout_s: float,
                 future: asyncio.Future) -> None:
        self.name, self.arguments, self.timeout_s, self.future = name, arguments, timeout_s, future
        self.scope: Any = None

    def cancel(self) -> None:
        if self.scope is not None:
            self.scope.cancel()


_CLOSE = object()
_STAT_OF = {"tool_error": "tool_errors", "protocol_error": "protocol_errors"}


class _Session:
    """One live MCP session, run by one background task that owns the SDK's contexts."""

    def __init__(self, spec: MCPServerSpec) -> None:
        loop = asyncio.get_running_loop()
        self.spec = spec
        self.jobs: asyncio.Queue = asyncio.Queue()
        self.ready: asyncio.Future = loop.create_future()
        self.dead = False
        self.error = ""
        self.listing: list[Any] = []
        self.inflight: set[_Job] = set()
        self.errlog = tempfile.TemporaryFile("w+") if spec.command else None
        self.task = loop.create_task(self._run(), name=f"mcp:{spec.label}")

    def stderr_tail(self) -> str:
        if self.errlog is None or self.errlog.closed:
            return ""
        try:
            self.errlog.flush()
            self.errlog.seek(0)
            text = self.errlog.read()[-_STDERR_TAIL:].strip()
        except (OSError, ValueError):
            return ""
        return f"; its stderr ends: {text}" if text else ""

    def _transport(self) -> tuple[Any, Any]:
        """(the SDK transport, an HTTP client to close with it or None)."""
        spec = self.spec
        if spec.command:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            env = dict(spec.env)
            if "PYTHONPATH" in os.environ and "PYTHONPATH" not in env:
                env["PYTHONPATH"] = os.environ["PYTHONPATH"]
            params = StdioServerParameters(command=spec.stdio_command(), args=list(spec.args),
                                           env=env, cwd=spec.cwd)
            return stdio_client(params, errlog=self.errlog), None
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers=dict(spec.headers),
                                  timeout=httpx2.Timeout(30.0, read=300.0))
        return streamable_http_client(spec.url, http_client=http), http

    async def _run(self) -> None:
        import anyio
        from mcp import Client

        try:
            # No cancel scope may wrap the entering of these contexts alone (anyio requires a
            # scope to be left by the task, in the order, it was entered): the connect timeout
            # is the caller's wait for `ready`, which cancels this task when it runs out.
            async with contextlib.AsyncExitStack() as stack:
                transport, http = self._transport()
                if http is not None:
                    await stack.enter_async_context(http)
                client = await stack.enter_async_context(Client(transport))
                listing, cursor = [], None
                for _ in range(100):
                    page = await client.list_tools(cursor=cursor)
                    listing += list(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.listing = listing
                if not self.ready.done():
                    self.ready.set_result(listing)
                async with anyio.create_task_group() as tg:
                    while True:
                        job = await self.jobs.get()
                        if job is _CLOSE:
                            break
                        tg.start_soon(self._call, client, job)
                    tg.cancel_scope.cancel()
        except BaseException as e:  # noqa: BLE001 - recorded; the callers see an error result
            self.error = self.error or _describe(e)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.dead = True
            self._fail_pending()

    def _fail_pending(self) -> None:
        error = MCPUnavailableError(
            f"MCP server '{self.spec.label}' stopped: {self.error or 'closed'}{self.stderr_tail()}")
        if not self.ready.done():
            self.ready.set_exception(error)
            self.ready.exception()  # retrieved: the connection reports it
        while not self.jobs.empty():
            job = self.jobs.get_nowait()
            if job is not _CLOSE:
                self.inflight.add(job)
        for job in self.inflight:  # queued, or cancelled with the session's task group
            if not job.future.done():
                job.future.set_exception(error)
                job.future.exception()  # retrieved even when its caller has gone
        if self.errlog is not None:
            self.errlog.close()

    async def _call(self, client: Any, job: _Job) -> None:
        import anyio
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        if job.future.done():  # the caller gave up before it started
            return
        self.inflight.add(job)
        try:
            with anyio.fail_after(job.timeout_s) as scope:  # TimeoutError at the deadline only
                job.scope = scope
                result = await client.call_tool(job.name, job.arguments)
            if not job.future.done() and not scope.cancelled_caught:
                job.future.set_result(result)
        except MCPError as e:
            if e.code == CONNECTION_CLOSED:
                self._lost(f"connection closed ({e.message})")
            if not job.future.done():
                job.future.set_exception(e)
        except TimeoutError as e:
            if not job.future.done():
                job.future.set_exception(e)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                ConnectionError, OSError) as e:
            self._lost(_describe(e))
            if not job.future.done():
                job.future.set_exception(e)
        except Exception as e:  # noqa: BLE001 - e.g. a result that fails the SDK's validation
            if not job.future.done():
                job.future.set_exception(e)
        finally:
            if job.future.done():
                self.inflight.discard(job)

    def _lost(self, why: str) -> None:
        """The transport broke: stop taking calls and wind the session down."""
        if not self.dead:
            self.dead = True
            self.error = why
            self.jobs.put_nowait(_CLOSE)

    def submit(self, name: str, arguments: dict[str, Any], timeout_s: float) -> _Job:
        job = _Job(name, arguments, timeout_s, asyncio.get_running_loop().create_future())
        if self.dead and self.task.done():  # wound down between the caller's check and now
            job.future.set_exception(MCPUnavailableError(
                f"MCP server '{self.spec.label}' stopped: {self.error or 'closed'}"))
        else:
            self.jobs.put_nowait(job)
        return job

    async def close(self) -> None:
        if not self.task.done():
            self.jobs.put_nowait(_CLOSE)
            try:
                await asyncio.wait_for(asyncio.shield(self.task), 10.0)
            except (TimeoutError, asyncio.CancelledError):
                self.task.cancel()
            except Exception:  # noqa: BLE001 - already recorded in self.error
                pass


def _describe(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        inner = [x for x in e.exceptions if not isinstance(x, asyncio.CancelledError)]
        if inner:
            return _describe(inner[0])
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# ----------------------------------------------------------------------------- connection


class MCPConnection:
    """One MCP server's session on one event loop, restarted when it dies.

    Shared (`mcp_connection(spec)`) by every environment of the loop, or private to one
    (`per_episode`). `stats` counts starts, restarts (starts after the first), calls, and the
    calls that ended in a tool error, a protocol error, a timeout or a lost server.
    """

    def __init__(self, spec: MCPServerSpec) -> None:
        self.spec = spec
        self.stats: dict[str, int] = dict.fromkeys(
            ("starts", "restarts", "calls", "tool_errors", "protocol_errors", "timeouts",
             "server_died", "unavailable"), 0)
        self._session: _Session | None = None
        self._lock: asyncio.Lock | None = None

    @property
    def alive(self) -> bool:
        """Whether a session is up (a dead one is replaced at the next call)."""
        s = self._session
        return (s is not None and not s.dead and s.ready.done() and not s.ready.cancelled()
                and s.ready.exception() is None)

    async def _ensure(self) -> _Session:
        s = self._session
        if s is not None and not s.dead and s.ready.done():
            return s
        _require_mcp()
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            s = self._session
            if s is None or s.dead:
                if s is not None:
                    self.stats["restarts"] += 1
                self.stats["starts"] += 1
                s = self._session = _Session(self.spec)
            try:
                await asyncio.wait_for(asyncio.shield(s.ready), self.spec.connect_timeout_s)
            except MCPUnavailableError:
                raise
            except TimeoutError:
                s.error = "no answer within connect_timeout_s"
                s.task.cancel()
                raise MCPUnavailableError(
                    f"MCP server '{self.spec.label}' did not answer within connect_timeout_s="
                    f"{self.spec.connect_timeout_s:g}") from None
            return s

    async def list_tools(self) -> list[Any]:
        """The server's tools (MCP `Tool` objects), starting it if needed.

        Raises:
          MCPUnavailableError: it cannot be started or reached (the message says why).
        """
        return list((await self._ensure()).listing)

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None, *,
                   timeout_s: float | None = None) -> ToolResult:
        """Calls the server's tool `name`; never raises (except for cancellation).

        `ok=False` results carry `error`: "tool_error" (the server flagged its result as an
        error), "protocol_error" (it refused the request: unknown tool, bad arguments...),
        "timeout", "server_died" (the connection broke; the next call starts it again) or
        "unavailable" (it cannot be started or reached).
        """
        t0 = time.monotonic()
        timeout_s = self.spec.timeout_s if timeout_s is None else timeout_s
        self.stats["calls"] += 1

        def fail(kind: str, text: str) -> ToolResult:
            self.stats[_STAT_OF.get(kind, kind)] += 1
            return ToolResult(name=name, content=text, ok=False, error=kind,
                              elapsed_s=time.monotonic() - t0)

        try:
            session = await self._ensure()
        except (MCPUnavailableError, ImportError) as e:
            return fail("unavailable", f"Error: the tool's server is unavailable: {e}")
        from mcp import MCPError

        job = session.submit(name, dict(arguments or {}), timeout_s)
        try:
            # The session enforces timeout_s itself; this margin only guards against a session
            # that stopped answering altogether.
            async with asyncio.timeout(timeout_s + 5.0):
                result = await job.future
        except asyncio.CancelledError:
            job.cancel()
            raise
        except TimeoutError:
            job.cancel()
            self.stats["timeouts"] += 1
            return ToolResult(name=name, ok=False, error="timeout", elapsed_s=time.monotonic() - t0,
                              content=f"Error: tool '{name}' gave no answer within {timeout_s:g} s")
        except MCPError as e:
            if session.dead:
                return fail("server_died", f"Error: the tool's server stopped during the call "
                                           f"({e.message}); it is restarted at the next call")
            return fail("protocol_error", f"Error: the server refused the call: {e.message}")
        except MCPUnavailableError as e:
            return fail("server_died", f"Error: {e}; it is restarted at the next call")
        except Exception as e:  # noqa: BLE001 - transport failures and invalid results
            if session.dead:
                return fail("server_died", f"Error: the tool's server stopped during the call "
                                           f"({_describe(e)}); it is restarted at the next call")
            return fail("protocol_error", f"Error: the server's answer was invalid: {_describe(e)}")
        text = result_text(result)
        if result.is_error:
            return fail("tool_error", _error_text(text or "the tool reported an error"))
        return ToolResult(name=name, content=text, elapsed_s=time.monotonic() - t0)

    async def reset(self, spec: MCPServerSpec | None = None) -> None:
        """Runs the `reset_tool` of `spec` (default: this connection's), if it names one.

        Raises:
          RuntimeError: the reset call failed (its result's message).
        """
        spec = spec or self.spec
        if spec.reset_tool is None:
            return
        result = await self.call(spec.reset_tool, json.loads(spec.reset_arguments),
                                 timeout_s=spec.timeout_s)
        if not result.ok:
            raise RuntimeError(f"MCP server '{spec.label}': reset_tool '{spec.reset_tool}' "
                               f"failed: {result.content}")

    async def close(self) -> None:
        """Ends the session (and a stdio server's process)."""
        s, self._session = self._session, None
        if s is not None:
            await s.close()


_CONNECTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""{event loop: {spec.key: MCPConnection}}: each loop's shared connections."""
_CONNECTIONS_LOCK = threading.Lock()


def mcp_connection(spec: MCPServerSpec | Mapping[str, Any]) -> MCPConnection:
    """The running event loop's shared connection to `spec`'s server (made on first use).

    Every environment of the loop (one environment worker) that names the same server (same
    command, args, env, cwd or URL and headers) shares one session and, for stdio, one process;
    the first spec's `connect_timeout_s` applies to it, each tool's own `timeout_s` to its calls.
    """
    spec = _one_spec(spec, "mcp_server")
    loop = asyncio.get_running_loop()
    with _CONNECTIONS_LOCK:
        per_loop = _CONNECTIONS.get(loop)
        if per_loop is None:
            per_loop = _CONNECTIONS[loop] = {}
        conn = per_loop.get(spec.key)
        if conn is None:
            conn = per_loop[spec.key] = MCPConnection(spec)
    return conn


async def close_mcp_connections(timeout_s: float = 10.0) -> list[str]:
    """Closes the running event loop's shared MCP connections (`mcp_connection`), each within
    `timeout_s` (a session that ignores the end is left behind).

    Returns:
      The labels of the servers whose session did not close in time.
    """
    from agentax._aio import bounded

    with _CONNECTIONS_LOCK:
        conns = list(_CONNECTIONS.pop(asyncio.get_running_loop(), {}).values())
    stuck = []
    for conn in conns:
        try:
            await bounded(conn.close(), timeout_s)
        except TimeoutError:
            stuck.append(conn.spec.label)
        except Exception:  # noqa: BLE001 - a broken session is already over
            pass
    return stuck


# ----------------------------------------------------------------------------- tools

_LISTINGS: dict[str, list[dict[str, Any]]] = {}
"""{spec.key: [{name, description, input_schema}]}: the last listing of each server seen in
this process, so that agent factories (sync, once per episode) list a server only once."""
_LISTINGS_LOCK = threading.Lock()


def _summaries(listing: Sequence[Any]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description or t.title or "",
             "input_schema": dict(t.input_schema or {})} for t in listing]


def _caller(spec: MCPServerSpec, name: str, connection: MCPConnection | None):
    async def call(**arguments: Any) -> ToolResult:
        conn = connection if connection is not None else mcp_connection(spec)
        return await conn.call(name, arguments, timeout_s=spec.timeout_s)

    return call


def _as_tools(spec: MCPServerSpec, listing: Sequence[Mapping[str, Any]],
              connection: MCPConnection | None) -> list[Tool]:
    offered = {t["name"]: t for t in listing}
    wanted = list(spec.tools) if spec.tools is not None else list(offered)
    missing = [n for n in wanted if n not in offered]
    if missing:
        raise ValueError(f"MCP server '{spec.label}' has no tool named {missing[0]!r} (its tools: "
                         f"{', '.join(offered) or 'none'}); fix the server's 'tools' list")
    out = []
    for mcp_name in wanted:
        t = offered[mcp_name]
        name = spec.prefix + mcp_name
        if not _TOOL_NAME.fullmatch(name):
            raise ValueError(f"MCP server '{spec.label}': tool name {name!r} is not usable (1-64 "
                             "letters, digits, _ . -, not starting with a digit); leave it out "
                             "with the server's 'tools' list or give a 'prefix'")
        schema = dict(t["input_schema"]) or {"type": "object", "properties": {}}
        schema.setdefault("type", "object")
        if schema.get("type") != "object":
            raise ValueError(f"MCP server '{spec.label}': tool {mcp_name!r} has an input schema of "
                             f"type {schema.get('type')!r}, not 'object'")
        out.append(Tool(name=name, description=t["description"], parameters=schema,
                        fn=_caller(spec, mcp_name, connection),
                        # The connection enforces spec.timeout_s itself and reports "timeout".
                        timeout_s=spec.timeout_s + 2.0, max_output_chars=spec.max_output_chars))
    return out


def _check_unique(tools: Sequence[Tool]) -> list[Tool]:
    seen: set[str] = set()
    for t in tools:
        if t.name in seen:
            raise ValueError(f"two MCP tools are named {t.name!r}; give one server a 'prefix'")
        seen.add(t.name)
    return list(tools)


async def mcp_tools(servers: Any, *,
                    connections: Mapping[str, MCPConnection] | None = None) -> list[Tool]:
    """The tools of every server in `servers` (specs or mappings), as agentax `Tool`s.

    Each server is reached through the loop's shared connection (or, for a spec's key in
    `connections`, through that one), started if needed; its listing is cached.

    Raises:
      ValueError: a bad spec (naming the field), or a tool list that cannot be used.
      MCPUnavailableError: a server cannot be started or reached.
    """
    out: list[Tool] = []
    for spec in mcp_server_specs(servers):
        conn = (connections or {}).get(spec.key) or mcp_connection(spec)
        listing = _summaries(await conn.list_tools())
        with _LISTINGS_LOCK:
            _LISTINGS[spec.key] = listing
        out += _as_tools(spec, listing, (connections or {}).get(spec.key))
    return _check_unique(out)


def mcp_tools_sync(servers: Any) -> list[Tool]:
    """`mcp_tools` for code that is not a coroutine (an agent factory, a config check).

    A server not listed before in this process is started once in a helper thread with its
    own event loop, listed and stopped; later calls reuse that listing. The tools returned call
    their server through the shared connection of whatever event loop runs them.
    """
    specs = mcp_server_specs(servers)
    out: list[Tool] = []
    if specs:
        _require_mcp()
    for spec in specs:
        with _LISTINGS_LOCK:
            listing = _LISTINGS.get(spec.key)
        if listing is None:
            listing = _list_in_thread(spec)
            with _LISTINGS_LOCK:
                _LISTINGS[spec.key] = listing
        out += _as_tools(spec, listing, None)
    return _check_unique(out)


def _list_in_thread(spec: MCPServerSpec) -> list[dict[str, Any]]:
    box: dict[str, Any] = {}

    async def once() -> list[dict[str, Any]]:
        conn = MCPConnection(spec)
        try:
            return _summaries(await conn.list_tools())
        finally:
            await conn.close()

    def run() -> None:
        try:
            box["value"] = asyncio.run(once())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name=f"mcp-list:{spec.label}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
