"""The loopback transport SDK agents get: keep-alive reuse, framing, retries, timeouts, fallback."""

from __future__ import annotations

import asyncio

import openai
import pytest

from agentax.serve._env import _sdk_httpx
from agentax.serve._loopback import loopback_transport

httpx = _sdk_httpx(openai)
pytestmark = pytest.mark.skipif(httpx is None, reason="the SDK's httpx module is not known")


class Fallback(httpx.AsyncBaseTransport):
    def __init__(self):
        self.urls = []

    async def handle_async_request(self, request):
        self.urls.append(str(request.url))
        return httpx.Response(200, content=b"fallback")


async def serve(replies, close_after=False, delay=0.0):
    """A raw HTTP/1.1 server answering each request with the next of `replies` (bytes after
    the status line); returns (server, port, connections accepted, request heads seen)."""
    accepted, heads = [], []

    async def on_conn(reader, writer):
        accepted.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                heads.append(head)
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                await asyncio.sleep(delay)
                writer.write(b"HTTP/1.1 200 OK\r\n" + replies[(len(heads) - 1) % len(replies)])
                await writer.drain()
                if close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], accepted, heads


FIXED = b"Content-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"
CHUNKED = b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n"


def test_keep_alive_framing_and_fallback():
    async def main():
        server, port, accepted, heads = await serve([FIXED, CHUNKED])
        fallback = Fallback()
        transport = loopback_transport(httpx, fallback)
        transport.serve("127.0.0.1", port)
        async with httpx.AsyncClient(transport=transport) as client:
            texts = [(await client.post(f"http://127.0.0.1:{port}/v1/x?a=1", json={"i": i})).text
                     for i in range(3)]
            other = await client.get(f"http://127.0.0.1:{port + 1}/elsewhere")
            async with client.stream("POST", f"http://127.0.0.1:{port}/s") as r:
                pieces = [p async for p in r.aiter_raw()]
        server.close()
        return texts, other.text, fallback.urls, len(accepted), heads, pieces

    texts, other, urls, conns, heads, pieces = asyncio.run(main())
    assert texts == ["hello", "abcde", "hello"]
    assert conns == 1  # every request on the one kept-alive connection
    assert heads[0].startswith(b"POST /v1/x?a=1 HTTP/1.1\r\n")
    assert other == "fallback" and urls[0].endswith("/elsewhere")
    assert b"".join(pieces) == b"abcde"  # chunked: pieces as they come


def test_a_connection_the_server_closed_is_retried_fresh():
    async def main():
        server, port, accepted, _ = await serve([FIXED], close_after=True)
        transport = loopback_transport(httpx, Fallback())
        transport.serve("127.0.0.1", port)
        async with httpx.AsyncClient(transport=transport) as client:
            out = []
            for _ in range(3):
                out.append((await client.get(f"http://127.0.0.1:{port}/")).text)
                await asyncio.sleep(0.05)  # the server's close reaches the pooled connection
        server.close()
        return out, len(accepted)

    out, conns = asyncio.run(main())
    assert out == ["hello"] * 3 and conns == 3


def test_read_timeout_and_cancel_close_the_connection():
    async def main():
        server, port, accepted, _ = await serve([FIXED], delay=0.5)
        transport = loopback_transport(httpx, Fallback())
        transport.serve("127.0.0.1", port)
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"http://127.0.0.1:{port}/", timeout=httpx.Timeout(5, read=0.1))
            task = asyncio.ensure_future(client.get(f"http://127.0.0.1:{port}/"))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            ok = (await client.get(f"http://127.0.0.1:{port}/")).text
        server.close()
        return ok, len(accepted)

    ok, conns = asyncio.run(main())
    assert ok == "hello" and conns == 3  # neither broken connection went back to the pool


def test_a_stalled_streamed_reply_times_out():
    async def main():
        server, port, _, _ = await serve([b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"])
        transport = loopback_transport(httpx, Fallback())
        transport.serve("127.0.0.1", port)
        async with httpx.AsyncClient(transport=transport) as client:
            async with client.stream("GET", f"http://127.0.0.1:{port}/",
                                     timeout=httpx.Timeout(5, read=0.2)) as r:
                got = []
                with pytest.raises(httpx.ReadTimeout):
                    async for piece in r.aiter_raw():
                        got.append(piece)
        server.close()
        return got

    assert asyncio.run(main()) == [b"abc"]
