"""The OpenAI chat-completions wire format: request validation and response bodies.

`parse_chat_request(body)` turns a JSON body into a `ChatRequest` or raises `APIError` (an
OpenAI-style error: HTTP status, message, `param`, `type`). Every field the endpoint does not
implement is rejected by name, never silently ignored. The response helpers build the
`chat.completion` object and the `chat.completion.chunk` stream events from one `Choice`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentax.records import Message, ToolCall, ToolCallError

__all__ = [
    "APIError",
    "ChatRequest",
    "Choice",
    "check_json",
    "check_response_format",
    "completion_body",
    "content_delta",
    "error_body",
    "parse_chat_request",
    "role_delta",
    "stream_event",
    "stream_events",
]

SUPPORTED_FIELDS = frozenset({
    "model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
    "max_completion_tokens", "stop", "n", "seed", "logprobs", "top_logprobs", "stream",
    "stream_options", "parallel_tool_calls", "response_format",
})
MAX_TOP_LOGPROBS = 20
JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
MAX_N = 16
MAX_STOP = 4
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays / objects a request body may have (a tool's JSON schema included)."""


class APIError(Exception):
    """An error answered with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code


def error_body(err: APIError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _is_surrogate_free(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate (or text that looks like one: then the full check runs)."""


def check_json(body: Any, text: str | None = None) -> None:
    """Rejects what valid JSON may hold but the endpoint cannot use, before anything reads it.

    Iterative (no recursion): nesting deeper than `MAX_JSON_DEPTH` and strings (keys included)
    with a lone UTF-16 surrogate (`"\\ud800"`: valid JSON escapes, not encodable text) get a 400
    naming where they are.

    Args:
      body: the parsed JSON.
      text: the JSON text `body` was parsed from, when it was decoded as strict UTF-8: without
        a surrogate escape in it no string can hold a surrogate, and only the nesting is
        walked (every request paid ~0.1 ms for the strings' check and their paths).

    Raises:
      APIError: 400 invalid_request_error.
    """
    if text is not None and _SURROGATE_ESCAPE.search(text) is None and _depth_within(body):
        return
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if not _is_surrogate_free(value):
                raise _bad(f"{path or 'the body'} holds a lone UTF-16 surrogate (an unpaired "
                           "\\uD800-\\uDFFF escape): it is not valid Unicode text", path or None)
            continue
        if isinstance(value, dict):
            items = value.items()
        elif isinstance(value, list):
            items = ((f"[{j}]", v) for j, v in enumerate(value))
        else:
            continue
        if depth >= MAX_JSON_DEPTH:
            raise _bad(f"the request body nests arrays / objects deeper than {MAX_JSON_DEPTH} levels",
                       path or None)
        for key, v in items:
            if isinstance(value, dict):
                if not _is_surrogate_free(key):
                    raise _bad(f"a key of {path or 'the body'} holds a lone UTF-16 surrogate: it "
                               "is not valid Unicode text", path or None)
                sub = f"{path}.{key}" if path else key
            else:
                sub = f"{path}{key}"
            if isinstance(v, (str, dict, list)):
                stack.append((v, sub, depth + 1))


def _depth_within(body: Any) -> bool:
    """Whether `body` nests arrays / objects at most `MAX_JSON_DEPTH` levels deep."""
    stack: list[tuple[Any, int]] = [(body, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth >= MAX_JSON_DEPTH:
            return False
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))
    return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatRequest:
    """A validated chat-completions request."""

    model: str
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] | None = None
    """Tool schemas (OpenAI function form) rendered into the prompt; None when none or tool_choice='none'."""
    tool_choice: str = "auto"
    """'auto', 'none', 'required', or 'function' (a named function must be called: `forced_tool`)."""
    forced_tool: str | None = None
    parallel_tool_calls: bool = True
    """False: only the first parsed tool call of a reply is returned."""
    response_format: str = "text"
    """'text', 'json_object' or 'json_schema' (the reply is validated, see `check_response_format`)."""
    json_schema: Mapping[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False


def _number(body: Mapping, key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise _bad(f"{key} must be a number in [{lo}, {hi}], got {v!r}", key)
    return float(v)


def _integer(body: Mapping, key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise _bad(f"{key} must be an integer {rng}, got {v!r}", key)
    return v


def _text_content(content: Any, param: str) -> str:
    """A message's content: a string, None, or a list of text parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise _bad(f"{param}[{j}]: only text content parts are supported, got {kind!r}", param)
            out.append(part["text"])
        return "".join(out)
    raise _bad(f"{param} must be a string or a list of text parts", param)


def _tool_call(raw: Any, param: str) -> ToolCall:
    fn = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise _bad(f"{param} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", param)
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except json.JSONDecodeError:
            raise _bad(f"{param}.function.arguments is not valid JSON", param) from None
    if not isinstance(args, Mapping):
        raise _bad(f"{param}.function.arguments must be a JSON object", param)
    return ToolCall(name=fn["name"], arguments=dict(args), id=str(raw.get("id") or ""))


def _message(raw: Any, i: int) -> Message:
    param = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise _bad(f"{param} must be an object", param)
    given_role = role = raw.get("role")
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant", "tool"):
        raise _bad(f"{param}.role must be system, developer, user, assistant or tool; got {role!r}",
                   f"{param}.role")
    unknown = set(raw) - {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
    if unknown:
        raise _bad(f"{param} has unsupported field(s) {sorted(unknown)}", param)
    if role != "assistant" and raw.get("content") is None:
        # OpenAI: content is required on system / developer / user / tool messages (an assistant
        # message may have tool_calls instead)
        raise _bad(f"{param}.content is required on a {given_role} message (a string or a list "
                   "of text parts)", f"{param}.content")
    if raw.get("name") is not None and not isinstance(raw["name"], str):
        raise _bad(f"{param}.name must be a string", f"{param}.name")
    calls: tuple[ToolCall, ...] = ()
    if raw.get("tool_calls"):
        if role != "assistant" or not isinstance(raw["tool_calls"], list):
            raise _bad(f"{param}.tool_calls must be a list on an assistant message", param)
        calls = tuple(_tool_call(c, f"{param}.tool_calls[{j}]") for j, c in enumerate(raw["tool_calls"]))
    name = raw.get("name")
    call_id = raw.get("tool_call_id")
    if role == "tool" and not isinstance(call_id, str):
        raise _bad(f"{param}: a tool message needs tool_call_id (a string)", f"{param}.tool_call_id")
    return Message(role=role, content=_text_content(raw.get("content"), f"{param}.content"),
                   tool_calls=calls, name=name if isinstance(name, str) else None,
                   tool_call_id=call_id if role == "tool" else None)


def _tool_choice(body: Mapping) -> tuple[str, str | None]:
    """(mode, forced function name) of `tool_choice`."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto", None
    if choice in ("auto", "none", "required"):
        return choice, None
    fn = choice.get("function") if isinstance(choice, Mapping) else None
    if isinstance(choice, Mapping) and choice.get("type") == "function" and \
            isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn["name"]:
        return "function", fn["name"]
    raise _bad("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
               f"'function': {{'name': ...}}}}, got {choice!r}", "tool_choice")


def _tools(body: Mapping, choice: str, forced: str | None) -> tuple[dict[str, Any], ...] | None:
    tools = body.get("tools")
    if tools is None or tools == []:
        if choice in ("required", "function"):
            raise _bad(f"tool_choice {choice!r} needs tools: the request lists none", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise _bad("tools must be a list", "tools")
    out = []
    for j, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" or \
                not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{j}] must be {{'type': 'function', 'function': {{'name', ...}}}}", "tools")
        out.append({"type": "function", "function": dict(fn)})
    if forced is not None and forced not in {t["function"]["name"] for t in out}:
        raise _bad(f"tool_choice names function {forced!r}, which is not in tools", "tool_choice")
    return tuple(out) if out and choice != "none" else None


def _response_format(body: Mapping) -> tuple[str, Mapping[str, Any] | None]:
    fmt = body.get("response_format")
    if fmt is None:
        return "text", None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind in ("text", "json_object"):
        return kind, None
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, Mapping) else None
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or \
                not isinstance(schema, Mapping):
            raise _bad("response_format json_schema must be {'type': 'json_schema', "
                       "'json_schema': {'name': ..., 'schema': {...}}}", "response_format")
        t = schema.get("type")
        if t is not None and t not in (*JSON_TYPES, "number", "integer"):
            raise _bad(f"response_format.json_schema.schema.type {t!r} is not a JSON type",
                       "response_format")
        return kind, schema
    raise _bad("response_format.type must be 'text', 'json_object' or 'json_schema', got "
               f"{kind!r}", "response_format")


def check_response_format(content: str | None, fmt: str, schema: Mapping[str, Any] | None) -> str | None:
    """Why `content` does not satisfy the response format (None when it does).

    json_object: the content parses as JSON and is an object. json_schema: it parses as JSON,
    its top-level value has the schema's `type`, and an object has the schema's `required`
    keys. Nested properties are not checked.
    """
    if fmt == "text":
        return None
    try:
        value = json.loads(content or "")
    except json.JSONDecodeError as e:
        return f"the reply is not valid JSON ({e})"
    if fmt == "json_object":
        return None if isinstance(value, dict) else "the reply is JSON but not an object"
    t = (schema or {}).get("type")
    ok = {"number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "integer": lambda v: isinstance(v, int) and not isinstance(v, bool)}.get(
        t, lambda v: t is None or isinstance(v, JSON_TYPES[t]) and not (
            t != "boolean" and isinstance(v, bool)))
    if not ok(value):
        return f"the reply's top-level value is not of the schema's type {t!r}"
    missing = [k for k in (schema or {}).get("required", ()) if isinstance(value, dict) and k not in value]
    if missing:
        return f"the reply lacks the schema's required key(s) {missing}"
    return None


def parse_chat_request(body: Any) -> ChatRequest:
    """Validates a decoded JSON body.

    Raises:
      APIError: 400 naming the field that is missing, malformed or not supported.
    """
    if not isinstance(body, Mapping):
        raise _bad("the request body must be a JSON object")
    unknown = sorted(set(body) - SUPPORTED_FIELDS)
    if unknown:
        raise _bad(f"unsupported field(s) {unknown}; this endpoint supports {sorted(SUPPORTED_FIELDS)}",
                   unknown[0], "unsupported_parameter")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise _bad("messages must be a non-empty list", "messages")
    messages = tuple(_message(m, i) for i, m in enumerate(raw_messages))
    if messages[-1].role == "assistant":
        raise _bad("the last message must not be an assistant message (continuing a partial "
                   "assistant reply is not supported)", "messages")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise _bad("give max_tokens or max_completion_tokens, not both", "max_tokens")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop) and len(stop) <= MAX_STOP:
        stop = tuple(stop)
    else:
        raise _bad(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    top_logprobs = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise _bad("logprobs must be a boolean", "logprobs")
    if top_logprobs and not logprobs:
        raise _bad("top_logprobs needs logprobs=true", "top_logprobs")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    tool_choice, forced = _tool_choice(body)
    response_format, schema = _response_format(body)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _bad("stream must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, Mapping) or set(opts) - {"include_usage"}:
        raise _bad("stream_options supports only include_usage", "stream_options")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise _bad("model must be a string", "model")
    return ChatRequest(
        model=model, messages=messages, tools=_tools(body, tool_choice, forced),
        tool_choice=tool_choice, forced_tool=forced, parallel_tool_calls=parallel is not False,
        response_format=response_format, json_schema=schema, top_logprobs=top_logprobs,
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 1e-6, 1.0),
        max_tokens=max_tokens, stop=stop, n=_integer(body, "n", 1, MAX_N) or 1,
        seed=_integer(body, "seed", -(2**63), 2**63 - 1), logprobs=logprobs, stream=stream,
        include_usage=bool(opts.get("include_usage", False)),
    )


# ----------------------------------------------------------------------------- responses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """One generated choice, ready to serialize."""

    index: int
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    logprobs: Sequence[tuple[str, float, Sequence[tuple[str, float]]]] | None = None
    """(token text, logprob, top alternatives as (text, logprob)) per generated token when the
    request asked for logprobs (no alternatives unless it asked for top_logprobs)."""
    completion_tokens: int = 0
    parse_errors: tuple[ToolCallError, ...] = ()
    """Malformed tool calls in the reply (its content keeps their text); not sent, recorded."""


def _tool_calls_json(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}} for c in calls]


def _token_json(t: str, v: float) -> dict[str, Any]:
    return {"token": t, "logprob": float(v), "bytes": list(t.encode("utf-8", "replace"))}


def _logprobs_json(lp: Sequence[tuple[str, float, Sequence[tuple[str, float]]]] | None
                   ) -> dict[str, Any] | None:
    if lp is None:
        return None
    return {"content": [{**_token_json(t, v), "top_logprobs": [_token_json(a, b) for a, b in top]}
                        for t, v, top in lp], "refusal": None}


def completion_body(request_id: str, created: int, model: str, choices: Sequence[Choice],
                    prompt_tokens: int) -> dict[str, Any]:
    """The `chat.completion` object."""
    completion_tokens = sum(c.completion_tokens for c in choices)
    out_choices = []
    for c in choices:
        message: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.tool_calls:
            message["tool_calls"] = _tool_calls_json(c.tool_calls)
        out_choices.append({"index": c.index, "message": message, "finish_reason": c.finish_reason,
                            "logprobs": _logprobs_json(c.logprobs)})
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": out_choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def stream_event(request_id: str, created: int, model: str, choice: Mapping[str, Any] | None,
                 **extra: Any) -> str:
    """One server-sent event (`data: {...}\n\n`) of a `chat.completion.chunk` stream."""
    body = {"id": request_id, "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": [choice] if choice is not None else [], **extra}
    return f"data: {json.dumps(body)}\n\n"


def role_delta(index: int = 0) -> dict[str, Any]:
    """The first chunk's choice of a streamed reply: the assistant role, no content yet."""
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None}


def content_delta(text: str, index: int = 0, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A chunk's choice carrying a piece of the reply's content."""
    return {"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}


def stream_events(request_id: str, created: int, model: str, choices: Sequence[Choice],
                  prompt_tokens: int, include_usage: bool, *, streamed: str | None = None) -> list[str]:
    """The events of a `chat.completion.chunk` stream not yet sent, ending in [DONE].

    Args:
      streamed: None when nothing was sent; else choice 0's role chunk and this much of its
        content left already (the content's pieces as they were generated), so only the rest
        of its content follows, then its tool calls and finish reason.
    """
    def event(choice: dict[str, Any] | None, **extra: Any) -> str:
        return stream_event(request_id, created, model, choice, **extra)

    out = []
    for c in choices:
        content = c.content or ""
        if c.index == 0 and streamed is not None:
            content = content[len(streamed):]
        else:
            out.append(event(role_delta(c.index)))
        if content:
            out.append(event(content_delta(content, c.index, _logprobs_json(c.logprobs))))
        if c.tool_calls:
            calls = [{"index": j, **call} for j, call in enumerate(_tool_calls_json(c.tool_calls))]
            out.append(event({"index": c.index, "delta": {"tool_calls": calls},
                              "logprobs": None if content else _logprobs_json(c.logprobs),
                              "finish_reason": None}))
        out.append(event({"index": c.index, "delta": {}, "logprobs": None,
                          "finish_reason": c.finish_reason}))
    if include_usage:
        completion_tokens = sum(c.completion_tokens for c in choices)
        out.append(event(None, usage={"prompt_tokens": prompt_tokens,
                                      "completion_tokens": completion_tokens,
                                      "total_tokens": prompt_tokens + completion_tokens}))
    out.append("data: [DONE]\n\n")
    return out
