"""The HTTP edge of the endpoint: OpenAI-shaped errors below the routes, and a drain on stop.

Every answer the endpoint gives has an OpenAI error body when it is an error, also where no
route runs:

* `json_http_protocol()`: uvicorn's HTTP protocol, whose answer to bytes that are not HTTP
  (a malformed request line, bad headers, a bad chunked body) is a 400 with the body
  `{"error": {"message", "type", "param", "code": "invalid_http_request"}}` instead of
  uvicorn's plain text;
* `RequestGate`: wraps the ASGI app; an exception that escapes it before a response started
  is a JSON 500, and it is what stops the server gently (`drain`): new requests get a 503
  `server_shutting_down`, requests already running finish within a bound, and those still
  running at the bound are answered 503 (a stream gets a final error event).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

from agentax.serve._protocol import APIError, error_body

__all__ = ["RequestGate", "json_http_protocol", "send_error"]

CUT_GRACE_S = 5.0
"""How long requests cut at the drain bound get to send their 503 before the server stops."""


def _json_head(status: int, reason: str, body: bytes, extra: list[tuple[bytes, bytes]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}".encode()]
    lines += [name + b": " + value for name, value in extra]
    lines += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(),
              b"connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def json_http_protocol() -> type:
    """uvicorn's HTTP protocol class (httptools where installed, else h11) answering a request
    it cannot parse with a JSON 400 (OpenAI error body) instead of plain text."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class JSONErrorProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            # called from the parser's `except` block: the error says what was wrong
            why = sys.exc_info()[1]
            detail = str(why).strip() if why is not None else ""
            message = f"malformed HTTP request: {detail or msg.rstrip('.')}"
            body = json.dumps(error_body(APIError(400, message, code="invalid_http_request")))
            data = body.encode()
            headers = list(getattr(getattr(self, "server_state", None), "default_headers", ()))
            self.transport.write(_json_head(400, "Bad Request", data, headers) + data)
            self.transport.close()

    return JSONErrorProtocol


async def send_error(send: Any, err: APIError, *, close: bool = False) -> None:
    """Answers an ASGI HTTP request with `err`'s status and OpenAI error body."""
    body = json.dumps(error_body(err)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _shutting_down(message: str) -> APIError:
    return APIError(503, message, type="server_error", code="server_shutting_down")


class _Reply:
    """What one request has sent so far."""

    __slots__ = ("status", "stream", "complete")

    def __init__(self) -> None:
        self.status = 0
        self.stream = False
        self.complete = False


class RequestGate:
    """Admits, tracks and (on stop) drains the HTTP requests of one ASGI app.

    Counts, for requests that ended while the server was stopping: `finished` (answered as
    usual), `refused` (a 503: arrived during the stop, or queued behind another call of their
    session) and `cut` (still running at the drain bound: a 503, or an error event ending
    their stream).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.stopping = False
        self.counts = {"finished": 0, "refused": 0, "cut": 0}
        self._active: set[asyncio.Task] = set()
        self._cut: set[asyncio.Task] = set()

    @property
    def in_flight(self) -> int:
        """Requests being handled now."""
        return len(self._active)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.stopping:
            self.counts["refused"] += 1
            await send_error(send, _shutting_down(
                "the server is shutting down and takes no new requests; retry against a server "
                "that is up"), close=True)
            return
        task = asyncio.current_task()
        assert task is not None
        reply = _Reply()

        async def tracked(message: Any) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                if self.stopping and not any(name.lower() == b"connection"
                                             for name, _ in message.get("headers") or ()):
                    # A reply sent during the drain ends its connection, so the client's next
                    # call opens a new one (a 503, or refused once the server is gone) instead
                    # of racing the server's exit on a kept-alive connection.
                    message = {**message, "headers": [*(message.get("headers") or ()),
                                                      (b"connection", b"close")]}
                reply.status = message["status"]
                reply.stream = any(name.lower() == b"content-type" and
                                   value.startswith(b"text/event-stream")
                                   for name, value in message.get("headers") or ())
            elif kind == "http.response.body" and not message.get("more_body", False):
                reply.complete = True
            await send(message)

        self._active.add(task)
        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if task not in self._cut:
                raise
            task.uncancel()
            await self._answer_cut(reply, send)
        except Exception as e:
            if reply.status:  # too late for an error status: uvicorn closes the connection
                raise
            logging.getLogger("uvicorn.error").error("Exception in ASGI application", exc_info=e)
            await send_error(send, APIError(500, f"{type(e).__name__}: {e}", type="server_error"),
                             close=True)
        finally:
            self._active.discard(task)
            if self.stopping and task not in self._cut:
                self.counts["refused" if reply.status == 503 else "finished"] += 1

    async def _answer_cut(self, reply: _Reply, send: Any) -> None:
        self.counts["cut"] += 1
        err = _shutting_down("the server shut down before this request finished (it was still "
                             "running at the end of the drain); retry it")
        if not reply.status:
            await send_error(send, err, close=True)
        elif reply.stream and not reply.complete:  # the SDK raises an `{"error": ...}` event
            event = f"data: {json.dumps(error_body(err))}\n\n".encode()
            await send({"type": "http.response.body", "body": event, "more_body": False})

    async def drain(self, timeout_s: float, hurry: asyncio.Event | None = None) -> dict[str, int]:
        """Refuses new requests (503); waits up to `timeout_s` for those running; cuts the rest.

        Args:
          timeout_s: the bound on the wait for running requests (0: cut them at once).
          hurry: set it to end the wait early (a second signal).

        Returns:
          The counts (see the class), with `in_flight`: requests running when it began.
        """
        self.stopping = True
        in_flight = len(self._active)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        waiter = asyncio.ensure_future(hurry.wait()) if hurry is not None else None
        try:
            while self._active and not (hurry is not None and hurry.is_set()):
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.wait({*self._active, *([waiter] if waiter else [])}, timeout=left,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            if waiter is not None:
                waiter.cancel()
        running = [t for t in self._active if not t.done()]
        for t in running:
            self._cut.add(t)
            t.cancel()
        if running:
            await asyncio.wait(running, timeout=CUT_GRACE_S)
        return {**self.counts, "in_flight": in_flight}
