"""A lean HTTP/1.1 transport for SDK agents that call the in-process endpoint on loopback.

`OpenAIAgentEnvironment` hands each episode's `openai.AsyncOpenAI` a client whose transport
speaks plain HTTP/1.1 to the endpoint's own `host:port` over kept-alive asyncio streams (one
request at a time per connection), and passes every other request (another host, a streamed
request body) to the SDK's usual transport. The endpoint and the agents share one event loop,
and the engine's step thread waits for that loop's GIL: aiohttp's request machinery (headers
multidicts, URL objects, cookie jar, tracing hooks, the httpx adapter) was ~0.3 ms of the
loop's time per model call, ~1.8 -> ~1.5 ms a call with the SDK's own work (stub engine).

Responses are read by their `Content-Length` or chunked framing (a streamed reply), else to
the connection's end. A connection goes back to the pool only when its response was read to
the end; one that failed, was cancelled or left unread is closed. A kept-alive connection the
server closed meanwhile is retried once on a fresh one when the request got no reply bytes.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

__all__ = ["loopback_transport"]

IDLE_S = 20.0
"""A pooled connection idle longer than this is closed, not reused (the endpoint's uvicorn
keeps an idle connection 30 s)."""


def loopback_transport(httpx: Any, fallback: Any) -> Any:
    """A transport (of the SDK's `httpx` module) that serves the endpoints it is told of.

    Args:
      httpx: the module the SDK's client is built on (`httpx2` or `httpx`).
      fallback: the transport every other request goes to.

    Returns:
      The transport; `transport.serve(host, port)` adds an endpoint.
    """

    class _Body(httpx.AsyncByteStream):
        def __init__(self, owner: Any, conn: tuple, length: int | None, chunked: bool,
                     timeout: float | None) -> None:
            # conn: (reader, writer, (host, port)); timeout: the request's read timeout, each read
            self.owner, self.conn, self.length, self.chunked = owner, conn, length, chunked
            self.timeout, self.done = timeout, False

        async def __aiter__(self):
            reader, timeout = self.conn[0], self.timeout
            try:
                if self.chunked:
                    while True:
                        async with asyncio.timeout(timeout):
                            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                            if size == 0:
                                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                                    pass  # trailers
                                break
                            data = await reader.readexactly(size + 2)
                        yield data[:-2]
                elif self.length is None:
                    while True:
                        async with asyncio.timeout(timeout):
                            data = await reader.read(1 << 16)
                        if not data:
                            break
                        yield data
                    self.length = -1  # read to the end: not reusable
                elif self.length:
                    async with asyncio.timeout(timeout):
                        data = await reader.readexactly(self.length)
                    yield data
            except TimeoutError as e:
                raise httpx.ReadTimeout("the endpoint's reply stalled") from e
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
                raise httpx.ReadError(f"reading the endpoint's reply: {e!r}") from e
            self.done = True

        async def aclose(self) -> None:
            if self.done and self.length != -1:
                self.owner._release(self.conn)
            else:
                self.conn[1].close()

    class LoopbackTransport(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.fallback = fallback
            self._idle: dict[tuple[str, int], list[tuple[Any, Any, float]]] = {}

        def serve(self, host: str, port: int) -> None:
            self._idle.setdefault((host, port), [])

        def _release(self, conn: tuple) -> None:
            self._idle[conn[2]].append((conn[0], conn[1], time.monotonic()))

        async def _connect(self, key: tuple[str, int], timeout: float | None,
                           fresh: bool = False) -> tuple[Any, Any, bool]:
            now, idle = time.monotonic(), self._idle[key]
            while idle and not fresh:
                reader, writer, since = idle.pop()
                if now - since < IDLE_S and not writer.is_closing() and not reader.at_eof():
                    return reader, writer, True
                writer.close()
            try:
                async with asyncio.timeout(timeout):
                    reader, writer = await asyncio.open_connection(*key)
            except TimeoutError as e:
                raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]}") from e
            except OSError as e:
                raise httpx.ConnectError(f"connecting to {key[0]}:{key[1]}: {e}") from e
            sock = writer.get_extra_info("socket")
            if sock is not None:  # no 40 ms delayed-ACK stall between headers and body
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return reader, writer, False

        async def handle_async_request(self, request: Any) -> Any:
            url = request.url
            key = (url.host, url.port or 80)
            if url.scheme != "http" or key not in self._idle:
                return await self.fallback.handle_async_request(request)
            try:
                body = request.content
            except httpx.RequestNotRead:  # a streamed upload: the usual transport sends it
                return await self.fallback.handle_async_request(request)
            timeouts = request.extensions.get("timeout", {})
            lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), url.raw_path)]
            lines += [k + b": " + v + b"\r\n" for k, v in request.headers.raw]
            lines.append(b"\r\n")
            message = b"".join(lines) + body
            for attempt in range(2):
                reader, writer, reused = await self._connect(key, timeouts.get("connect"),
                                                             fresh=attempt > 0)
                try:
                    writer.write(message)
                    async with asyncio.timeout(timeouts.get("read")):
                        head = await reader.readuntil(b"\r\n\r\n")
                except TimeoutError as e:
                    writer.close()
                    raise httpx.ReadTimeout("the endpoint did not reply in time") from e
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                    writer.close()
                    got = isinstance(e, asyncio.IncompleteReadError) and e.partial
                    if reused and not got and attempt == 0:
                        continue  # the server closed the idle connection: once more, fresh
                    raise httpx.ReadError(f"the endpoint's reply: {e!r}") from e
                except BaseException:
                    writer.close()
                    raise
                break
            try:
                status_line, *header_lines = head[:-4].split(b"\r\n")
                status = int(status_line.split(b" ", 2)[1])
                headers, length, chunked, close = [], None, False, False
                for line in header_lines:
                    name, value = line.split(b":", 1)
                    value = value.strip()
                    low = name.lower()
                    if low == b"content-length":
                        length = int(value)
                    elif low == b"transfer-encoding":
                        chunked = b"chunked" in value.lower()
                    elif low == b"connection":
                        close = b"close" in value.lower()
                    headers.append((name, value))
            except (ValueError, IndexError) as e:
                writer.close()
                raise httpx.RemoteProtocolError(f"a malformed reply head: {head[:200]!r}") from e
            if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                length, chunked = 0, False
            stream = _Body(self, (reader, writer, key), length, chunked, timeouts.get("read"))
            if close:
                stream.length = -1 if length is None or chunked else length
                stream.owner = _Closing()
            return httpx.Response(status, headers=headers, stream=stream,
                                  extensions={"http_version": b"HTTP/1.1"})

        async def aclose(self) -> None:
            for idle in self._idle.values():
                while idle:
                    idle.pop()[1].close()
            await self.fallback.aclose()

    class _Closing:
        """Owner of a `Connection: close` reply's connection: closes it when read."""

        @staticmethod
        def _release(conn: tuple) -> None:
            conn[1].close()

    return LoopbackTransport()
