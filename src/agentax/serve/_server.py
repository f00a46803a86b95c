"""`ChatServer`: the OpenAI-compatible HTTP endpoint, served in the engine's own process.

Starlette routes on a uvicorn server that runs as a task on the caller's event loop (the
collector's loop in training), so a request handler awaits `Engine.generate` directly: no
thread hop, no second process. Routes, under `/v1` (sessions by API key) and under
`/s/{session}/v1` (sessions by base-URL path):

* `POST .../chat/completions` — chat completions (JSON, or `stream=true` server-sent events
  whose content leaves token by token as the engine generates it);
* `GET .../models`, `GET .../models/{id}` — the one served model;
* `POST /s/{session}/v1/reward` — `{"reward": x}`: an agent program reports its reward.

Every error has an OpenAI-style body (`{"error": {"message", "type", "param", "code"}}`): bad
requests a 400 naming the field, bytes that are not HTTP a 400 `invalid_http_request`, a
model the server does not serve a 404 `model_not_found`, an unknown path a 404, a wrong method
a 405, a body over `max_request_bytes` a 413 before it is parsed, a failure of the server a
500, and a request the stopping server will not run a 503 `server_shutting_down`. A session
serializes its own calls; other sessions are untouched. `stop(drain_s=...)` lets the
requests running finish (bounded) and answers the others 503 (`agentax.serve._http`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import itertools
import json
import logging
import secrets
import socket
import time
import weakref
from collections.abc import Mapping
from typing import Any

from agentax.contracts import EngineClient
from agentax.records import SamplingParams
from agentax.serve._http import RequestGate, json_http_protocol
from agentax.serve._protocol import (
    MAX_JSON_DEPTH,
    APIError,
    ChatRequest,
    check_json,
    completion_body,
    content_delta,
    error_body,
    parse_chat_request,
    role_delta,
    stream_event,
    stream_events,
)
from agentax.serve._session import Session, SessionLimits

__all__ = ["ChatServer", "shared_server"]

SERVE_CONTEXT_HINT = ("restart `agentax serve` with a larger --max-seq-len (EngineConfig.max_seq_len "
                      "when the Engine is built in Python)")
TRAIN_CONTEXT_HINT = "raise the run's engine.max_seq_len (with collector.max_episode_tokens)"
STOP_TIMEOUT_S = 5
"""After the drain: the bound on uvicorn's own shutdown (connections closing)."""


def _need_stack():
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(f"the OpenAI endpoint needs starlette and uvicorn ({e}); "
                          "install them with `pip install 'agentax[serve]'`") from None


class ChatServer:
    """An OpenAI chat-completions endpoint backed by an `Engine`.

    Args:
      engine: the `agentax.engine.Engine` to generate with.
      tokenizer: the model's tokenizer (chat template, tool-call markers).
      model_name: the id `GET /v1/models` reports; a request naming another model gets a 404
        `model_not_found` (unless `check_model=False`).
      check_model: reject requests whose `model` is not `model_name` (and those without one).
        False (the training endpoint): an agent trained unchanged may name any model.
      context_hint: what a `context_length_exceeded` error tells the caller to raise.
      tool_format: tool-call parser ("hermes", "llama3", or a registered one).
      template_kwargs: extra chat-template variables.
      host / port: where to listen (loopback by default; port 0 picks a free port).
      open_sessions: create a session for any new API key or path (serving). False: only
        sessions opened with `open_session` exist (training), others get a 404.
      max_sessions: most open-on-demand sessions kept; the least recently used is closed.
      max_request_bytes: largest request body accepted.
      default_max_tokens: completion length when a serving request gives none.
    """

    def __init__(self, engine: EngineClient, tokenizer: Any, *, model_name: str = "agentax",
                 tool_format: str = "hermes", template_kwargs: Mapping[str, Any] | None = None,
                 host: str = "127.0.0.1", port: int = 0, open_sessions: bool = True,
                 max_sessions: int = 1024, max_request_bytes: int = 4 << 20,
                 default_max_tokens: int = 256, check_model: bool = True,
                 context_hint: str = SERVE_CONTEXT_HINT) -> None:
        _need_stack()
        from agentax.text import get_tool_parser

        get_tool_parser(tool_format)
        self.engine, self.tokenizer = engine, tokenizer
        self.model_name, self.tool_format = model_name, tool_format
        self.template_kwargs = dict(template_kwargs or {})
        self.host, self.port = host, port
        self.open_sessions, self.max_sessions = open_sessions, max_sessions
        self.max_request_bytes, self.default_max_tokens = max_request_bytes, default_max_tokens
        self.check_model, self.context_hint = check_model, context_hint
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self._server: Any = None
        self._prefix = secrets.token_hex(4)
        self._request_ids = itertools.count(1)
        self._task: asyncio.Task | None = None
        self.url = ""
        """`http://host:port` once started."""
        self.gate = RequestGate(self._build_app())
        """The ASGI app as served: it tracks requests, and drains them on `stop`."""
        self.app = self.gate

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Starts listening on the running loop; returns the server's URL."""
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # the host program owns the signal handlers
                yield

        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so, and without
        # it every response (headers, then body) waits ~40 ms for the client's delayed ACK.
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                             socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, http=json_http_protocol(), log_level="warning",
                                lifespan="off", access_log=False, timeout_keep_alive=30,
                                timeout_graceful_shutdown=STOP_TIMEOUT_S)
        _quiet_cancelled_requests()  # after Config, which (re)configures uvicorn's loggers
        self._server = _Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the endpoint stopped while starting")
            await asyncio.sleep(0.005)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}"
        return self.url

    async def stop(self, *, drain_s: float = 0.0, hurry: asyncio.Event | None = None
                   ) -> dict[str, int]:
        """Stops serving: drains the requests, closes every session, stops listening.

        From the call on, a new request gets a 503 `server_shutting_down`, and so does a call
        waiting behind another call of its session. Requests already running get `drain_s`
        seconds to finish; those still running then are answered 503 (a stream ends with an
        error event) and their engine work is cancelled.

        Args:
          drain_s: the bound on the wait for running requests (0: cut them at once).
          hurry: an event that ends the wait early when set (a second signal).

        Returns:
          `RequestGate.drain`'s counts (in_flight, finished, refused, cut), the refusals
          counted until the listener closed.
        """
        self.gate.stopping = True
        for s in self._sessions.values():
            s.shut_down()
        counts = await self.gate.drain(drain_s, hurry)
        for s in list(self._sessions.values()):
            s.close()
        self._sessions.clear()
        if self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, STOP_TIMEOUT_S + 5.0)
        return {**self.gate.counts, "in_flight": counts["in_flight"]}  # refusals to the end

    async def __aenter__(self) -> ChatServer:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # ------------------------------------------------------------------ sessions

    def open_session(self, *, sampling: SamplingParams | None = None,
                     limits: SessionLimits = SessionLimits(), role: str | None = None) -> Session:
        """A new session with a fresh unguessable id; its base URL is `session_url(session)`
        (`role`: the episode role whose calls it serves, traced on that role's track)."""
        sid = f"{self._prefix}{secrets.token_urlsafe(9)}"
        session = Session(sid, self.engine, self.tokenizer, tool_format=self.tool_format,
                          template_kwargs=self.template_kwargs, sampling=sampling, limits=limits,
                          default_max_tokens=self.default_max_tokens, context_hint=self.context_hint,
                          role=role)
        self._sessions[sid] = session
        return session

    def session_url(self, session: Session) -> str:
        """The base URL an OpenAI client of this session uses (`.../s/{id}/v1`)."""
        return f"{self.url}/s/{session.id}/v1"

    def close_session(self, session: Session) -> None:
        session.close()
        self._sessions.pop(session.id, None)

    def session(self, sid: str) -> Session | None:
        return self._sessions.get(sid)

    def _lookup(self, sid: str | None) -> Session:
        if not sid:
            raise APIError(401, "no session: give an API key (Authorization: Bearer KEY) or use "
                           "a /s/{session}/v1 base URL", type="authentication_error")
        s = self._sessions.get(sid)
        if s is not None:
            self._sessions.move_to_end(sid)
            return s
        if not self.open_sessions:
            raise APIError(404, f"unknown session {sid[:16]!r}", code="session_not_found")
        while len(self._sessions) >= self.max_sessions:
            _, old = self._sessions.popitem(last=False)
            old.close()
        s = Session(sid, self.engine, self.tokenizer, tool_format=self.tool_format,
                    template_kwargs=self.template_kwargs, default_max_tokens=self.default_max_tokens,
                    context_hint=self.context_hint)
        self._sessions[sid] = s
        return s

    # ------------------------------------------------------------------ HTTP

    @property
    def served_models(self) -> tuple[str, ...]:
        """The model ids `GET /v1/models` lists (and requests may name)."""
        return (self.model_name,)

    def _model_object(self, model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "agentax"}

    def _check_model(self, model: str) -> None:
        if not self.check_model:
            return
        if not model:
            raise APIError(400, "you must provide a model parameter (GET /v1/models lists the "
                           f"served one: {self.model_name!r})", param="model")
        if model not in self.served_models:
            raise APIError(404, f"The model `{model}` does not exist or you do not have access to "
                           f"it. This server serves {list(self.served_models)} (GET /v1/models).",
                           param="model", code="model_not_found")

    async def _stream(self, req: ChatRequest, session: Session) -> Any:
        """A `stream=true` reply: content pieces leave as the engine generates them.

        The reply waits for the first piece (or the end) before it starts, so a request that
        fails before any content (a prompt too long, a reply that misses its tool_choice or
        response_format, which are held to the end) still gets an HTTP error with its status;
        a failure after the first piece ends the stream with an `{"error": ...}` event (the
        SDK raises it). A client that disconnects cancels the engine request (its slot is
        freed).
        """
        from starlette.responses import JSONResponse, StreamingResponse

        rid, created = f"chatcmpl-{self._prefix}-{next(self._request_ids)}", int(time.time())
        model = req.model or self.model_name
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        task = asyncio.ensure_future(session.complete(req, on_delta=pieces.put_nowait))
        task.add_done_callback(lambda _: pieces.put_nowait(None))  # after every piece
        try:
            first = await pieces.get()
        except BaseException:
            task.cancel()
            raise
        if first is None:  # done before any piece: one response, or an HTTP error
            try:
                choices, prompt_tokens = task.result()
            except APIError as e:
                return JSONResponse(error_body(e), status_code=e.status)
            except Exception as e:  # noqa: BLE001 - an engine failure answers this call only
                return JSONResponse(error_body(_server_error(e)), status_code=500)
            events = stream_events(rid, created, model, choices, prompt_tokens, req.include_usage)
        else:
            events = None

        async def gen():
            if events is not None:
                for ev in events:
                    yield ev
                return
            try:
                yield stream_event(rid, created, model, role_delta())
                sent, piece = "", first
                while piece is not None:
                    sent += piece
                    yield stream_event(rid, created, model, content_delta(piece))
                    piece = await pieces.get()
                try:
                    choices, prompt_tokens = task.result()
                except Exception as e:  # noqa: BLE001 - told to the client, which raises it
                    err = e if isinstance(e, APIError) else _server_error(e)
                    yield f"data: {json.dumps(error_body(err))}\n\n"
                    return
                for ev in stream_events(rid, created, model, choices, prompt_tokens,
                                        req.include_usage, streamed=sent):
                    yield ev
            finally:  # the client went away mid-stream: stop generating for it
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    task.exception()  # retrieved (it was told, or nobody is left to tell)

        return StreamingResponse(gen(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def _build_app(self):
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        def error(e: APIError, headers: Mapping[str, str] | None = None) -> JSONResponse:
            return JSONResponse(error_body(e), status_code=e.status, headers=headers)

        async def http_error(request, exc: HTTPException) -> JSONResponse:
            # Starlette's own 404 (no route) / 405 (wrong method), OpenAI-shaped
            if exc.status_code == 404:
                e = APIError(404, f"Invalid URL ({request.method} {request.url.path}): no such "
                             "route; this endpoint serves POST /v1/chat/completions, GET "
                             "/v1/models and GET /v1/models/{model}", code="unknown_url")
            elif exc.status_code == 405:
                e = APIError(405, f"Method {request.method} is not allowed on {request.url.path} "
                             f"(allowed: {(exc.headers or {}).get('Allow', '?')})",
                             code="method_not_allowed")
            else:
                e = APIError(exc.status_code, str(exc.detail),
                             type="invalid_request_error" if exc.status_code < 500 else "server_error")
            return error(e, exc.headers)

        async def server_error(request, exc: Exception) -> JSONResponse:
            # what escapes a handler off the hot route (Starlette's own answer is plain text)
            return error(_server_error(exc))

        def session_id(request) -> str | None:
            sid = request.path_params.get("sid")
            if sid:
                return sid
            auth = request.headers.get("authorization", "")
            return auth[7:].strip() if auth.lower().startswith("bearer ") else None

        async def read_json(request) -> Any:
            length = request.headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_request_bytes):
                raise APIError(413, f"request body over {self.max_request_bytes} bytes")
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > self.max_request_bytes:
                    raise APIError(413, f"request body over {self.max_request_bytes} bytes")
            # strict UTF-8 text lets check_json skip its strings; anything else (a BOM, UTF-16 /
            # 32, encoded surrogates) is json.loads's to detect and decode, and checked in full
            text = None
            if body[:3] != b"\xef\xbb\xbf" and b"\0" not in body[:4]:
                with contextlib.suppress(UnicodeDecodeError):
                    text = body.decode("utf-8")
            try:
                value = json.loads(body if text is None else text)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise APIError(400, f"the request body is not valid JSON ({e})") from None
            except RecursionError:
                raise APIError(400, "the request body nests arrays / objects too deeply (at most "
                               f"{MAX_JSON_DEPTH} levels)") from None
            check_json(value, text)
            return value

        async def chat(request):
            try:
                req = parse_chat_request(await read_json(request))
                self._check_model(req.model)
                session = self._lookup(session_id(request))
                if req.stream:
                    return await self._stream(req, session)
                choices, prompt_tokens = await session.complete(req)
            except APIError as e:
                return error(e)
            except Exception as e:  # noqa: BLE001 - an engine failure answers this call only
                return error(_server_error(e))
            rid, created = f"chatcmpl-{self._prefix}-{next(self._request_ids)}", int(time.time())
            model = req.model or self.model_name
            return JSONResponse(completion_body(rid, created, model, choices, prompt_tokens))

        async def models(request):
            return JSONResponse({"object": "list",
                                 "data": [self._model_object(m) for m in self.served_models]})

        async def model(request):
            model_id = request.path_params["model_id"]
            if model_id not in self.served_models:
                return error(APIError(404, f"The model `{model_id}` does not exist or you do not "
                                      f"have access to it. This server serves "
                                      f"{list(self.served_models)}.", param="model",
                                      code="model_not_found"))
            return JSONResponse(self._model_object(model_id))

        async def reward(request):
            try:
                body = await read_json(request)
                value = body.get("reward") if isinstance(body, Mapping) else None
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise APIError(400, 'the body must be {"reward": <number>}', param="reward")
                session = self._lookup(request.path_params["sid"])
            except APIError as e:
                return error(e)
            session.reward = float(value)
            return JSONResponse({"ok": True})

        routes = []
        for prefix in ("/v1", "/s/{sid}/v1"):
            routes += [Route(f"{prefix}/chat/completions", chat, methods=["POST"]),
                       Route(f"{prefix}/models", models, methods=["GET"]),
                       Route(f"{prefix}/models/{{model_id:path}}", model, methods=["GET"])]
        routes.append(Route("/s/{sid}/v1/reward", reward, methods=["POST"]))
        routed = Starlette(routes=routes, exception_handlers={HTTPException: http_error,
                                                              Exception: server_error})

        async def app(scope, receive, send):
            # The hot route, a POST of chat completions, straight to its handler: Starlette's
            # middleware layers and route matching were ~0.1 ms of the loop's time per model
            # call (the engine's step thread waits for the loop's GIL). The same handler and
            # responses; every other request, and any other method, goes through the router.
            if scope["type"] == "http" and scope["method"] == "POST":
                sid = _chat_route_session(scope["path"])
                if sid is not None:
                    scope["app"] = routed  # as the router would leave it (request.app)
                    scope["path_params"] = {"sid": sid} if sid else {}
                    response = await chat(Request(scope, receive))
                    await response(scope, receive, send)
                    return
            await routed(scope, receive, send)

        return app


def _chat_route_session(path: str) -> str | None:
    """The session of a chat-completions path: "" for `/v1/chat/completions` (the API key
    names it), the `{sid}` of `/s/{sid}/v1/chat/completions`; None for any other path."""
    if path == "/v1/chat/completions":
        return ""
    if path.startswith("/s/") and path.endswith("/v1/chat/completions"):
        sid = path[3:-20]
        if sid and "/" not in sid:
            return sid
    return None


def _server_error(e: BaseException) -> APIError:
    return APIError(500, f"{type(e).__name__}: {e}", type="server_error")


_SHARED: dict[tuple[int, int], tuple[Any, Any, ChatServer]] = {}


async def shared_server(engine: Any, tokenizer: Any, *, tool_format: str = "hermes",
                        template_kwargs: Mapping[str, Any] | None = None) -> ChatServer:
    """The training endpoint of `engine` on the running loop, started on first use.

    One server per (engine, event loop): every black-box episode of a run opens its session
    on it. Sessions exist only when an episode opens them (`open_sessions=False`). Starting
    one freezes the heap built so far (`gc.freeze()`: out of the cyclic collector's scans).
    """
    loop = asyncio.get_running_loop()
    key = (id(engine), id(loop))
    entry = _SHARED.get(key)
    if entry is not None and entry[0]() is engine and entry[1]() is loop:
        server = entry[2]
    else:
        # The heap the run built before its first black-box episode (JAX, the model, compiled
        # kernels, tasks: ~0.2M objects) leaves the cyclic collector's reach, as `agentax
        # train` does after start-up: an SDK agent's calls allocate several times a native
        # episode's objects, and the full collections they set off scanned that heap on the
        # loop (0.14 s each on a 2-core host, engine's step thread stalled for the GIL).
        gc.freeze()
        server = ChatServer(engine, tokenizer, tool_format=tool_format,
                            template_kwargs=template_kwargs, open_sessions=False,
                            check_model=False, context_hint=TRAIN_CONTEXT_HINT)
        _SHARED[key] = (weakref.ref(engine), weakref.ref(loop), server)
        server._starting = loop.create_task(server.start())  # type: ignore[attr-defined]
    await asyncio.shield(server._starting)  # type: ignore[attr-defined]
    if server.tool_format != tool_format:
        raise ValueError(f"the engine's endpoint parses {server.tool_format!r} tool calls; an "
                         f"environment asked for {tool_format!r}: use one tool_format per run")
    return server


class _CancelledRequest(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" for a request cancelled because its
    program is stopping (a run interrupted or failed cancels every episode, and each
    episode's open model call was one traceback): not an error of the app."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


def _quiet_cancelled_requests() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _CancelledRequest) for f in logger.filters):
        logger.addFilter(_CancelledRequest())
