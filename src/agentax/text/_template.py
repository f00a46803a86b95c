"""Chat templates: render a model's own jinja chat template without `transformers`.

The jinja environment is configured the way `transformers.apply_chat_template` configures it
(sandboxed, `trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter
that does not escape HTML and accepts `indent` / `separators` / `sort_keys`, the globals
`raise_exception` and `strftime_now`, and namespaces that refuse underscore names), so a
template renders to the same text here as there. `{% generation %}` blocks are accepted and
render their body (assistant masks come from `render_conversation`, which works for every
template, not only those that mark generation blocks).

A chat template comes with a model download, so it is untrusted code: besides jinja's sandbox
(no attribute access to internals, `range` capped), every render is bounded in output size
(`ChatTemplate.max_chars`, also applied to every value a template builds: repetition, `+`,
filters, calls, namespace attributes) and in time (`ChatTemplate.timeout_s`: a watchdog raises
in the rendering thread, interrupting any template loop). Exceeding either raises
`TemplateLimitError`, which says which bound to raise.
"""

from __future__ import annotations

import contextvars
import ctypes
import dataclasses
import functools
import heapq
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agentax.records import Message, ToolCall

__all__ = ["ChatTemplate", "TemplateLimitError"]


class TemplateLimitError(RuntimeError):
    """A chat template exceeded its output-size or time bound while rendering."""


_MAX_CHARS: contextvars.ContextVar[int] = contextvars.ContextVar("agentax_template_max_chars", default=4_000_000)


def _bounded(value: Any) -> Any:
    """`value`, or TemplateLimitError when it is a string / container beyond the size bound."""
    if isinstance(value, str | list | tuple | dict | bytes) and len(value) > _MAX_CHARS.get():
        raise TemplateLimitError(
            f"chat template built a value of {len(value)} items, more than max_chars="
            f"{_MAX_CHARS.get()}; raise ChatTemplate.max_chars if the template is trusted"
        )
    return value


_WIDENING = frozenset({"center", "indent", "wordwrap", "ljust", "rjust", "zfill", "expandtabs"})
"""Filters and str methods whose numeric arguments are output widths."""
_FORMATTING = frozenset({"format", "format_map"})
_NUMBER = re.compile(r"\d+")


def _check_call(name: str | None, target: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuses a call that would build a value past the bound before it runs.

    Args:
      name: the filter or method name; target: the string it applies to (or None).
    """
    limit = _MAX_CHARS.get()
    values = (*args, *kwargs.values())
    for a in values:
        _bounded(a)
    if name in _WIDENING:
        for a in values:
            if isinstance(a, int | float) and not isinstance(a, bool) and abs(a) > limit:
                raise TemplateLimitError(f"chat template asked {name} for width {a!r}, more than max_chars={limit}")
    if name in _FORMATTING and isinstance(target, str):
        _check_format_string(target)
    if name == "replace" and isinstance(target, str) and len(args) >= 2:
        grow = max(0, len(str(args[1])) - len(str(args[0]))) * (len(target) + 1)
        if len(target) + grow > limit:
            raise TemplateLimitError(f"chat template replace could build {len(target) + grow} chars, more than max_chars={limit}")


def _check_format_string(fmt: str) -> None:
    """A width or precision in a format string ("%99999999d", "{:>99999999}") beyond the bound."""
    limit = _MAX_CHARS.get()
    if any(int(n) > limit for n in _NUMBER.findall(fmt) if len(n) >= len(str(limit))):
        raise TemplateLimitError(f"chat template format string asks for a width beyond max_chars={limit}")


def _bounded_filter(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        skip = 2 if getattr(fn, "jinja_pass_arg", None) else 1  # the context, then the value
        value = args[skip - 1] if len(args) >= skip else None
        _bounded(value)
        _check_call(name, value, args[skip:], kwargs)
        return _bounded(fn(*args, **kwargs))

    return wrapper


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """jinja's immutable sandbox plus size checks on the operators and calls that grow values."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context, operator_name, left, right):
        if operator_name == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * n > _MAX_CHARS.get():
                    raise TemplateLimitError(
                        f"chat template repeats a value of {len(seq)} items {n} times, more than "
                        f"max_chars={_MAX_CHARS.get()}"
                    )
        if operator_name == "**" and isinstance(right, int | float) and abs(right) > 1024:
            raise TemplateLimitError(f"chat template raises to the power {right!r}; at most 1024")
        if operator_name == "%" and isinstance(left, str):
            _check_format_string(left)
        return _bounded(super().call_binop(context, operator_name, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's signature
        _check_call(getattr(__obj, "__name__", None), getattr(__obj, "__self__", None), args, kwargs)
        return _bounded(super().call(__context, __obj, *args, **kwargs))


class _Watchdog:
    """Raises TemplateLimitError in the calling thread once `timeout_s` has passed."""

    def __init__(self, timeout_s: float) -> None:
        self.thread_id = threading.get_ident()
        self.lock = threading.Lock()
        self.done = self.fired = False
        self.deadline = time.monotonic() + timeout_s

    def _fire(self) -> None:
        with self.lock:
            if not self.done:
                self.fired = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.thread_id), ctypes.py_object(_TemplateTimeout)
                )

    def __enter__(self) -> _Watchdog:
        _DEADLINES.add(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.done = True
            if self.fired:  # an exception may still be pending: clear it, it is reported below
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)


class _Deadlines:
    """One daemon thread fires every render's watchdog at its deadline. (A `threading.Timer`
    per render started a thread each time: ~0.6 ms of the event loop's time per render.)"""

    def __init__(self) -> None:
        self.pid = -1

    def add(self, dog: _Watchdog) -> None:
        if self.pid != os.getpid():  # first use, or a forked child: the thread is not here
            with _DEADLINES_START:
                if self.pid != os.getpid():
                    self.heap, self.count, self.cond = [], itertools.count(), threading.Condition()
                    threading.Thread(target=self._run, args=(self.heap, self.cond),
                                     name="agentax-template-watchdog", daemon=True).start()
                    self.pid = os.getpid()
        with self.cond:
            if len(self.heap) >= 4096:  # finished renders wait for their deadline: drop them now
                self.heap[:] = [entry for entry in self.heap if not entry[2].done]
                heapq.heapify(self.heap)
            heapq.heappush(self.heap, (dog.deadline, next(self.count), dog))
            if self.heap[0][2] is dog:
                self.cond.notify()

    @staticmethod
    def _run(heap: list, cond: threading.Condition) -> None:
        with cond:
            while True:
                while heap and heap[0][2].done:
                    heapq.heappop(heap)
                delay = heap[0][0] - time.monotonic() if heap else None
                if delay is not None and delay <= 0:
                    heapq.heappop(heap)[2]._fire()
                else:
                    cond.wait(delay)


_DEADLINES, _DEADLINES_START = _Deadlines(), threading.Lock()


class _TemplateTimeout(TemplateLimitError):
    pass

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """A jinja namespace that refuses underscore-prefixed attribute names (sandbox hygiene)."""

    def __init__(*args, **kwargs):  # same signature trick as jinja's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, _bounded(value))

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes, got {name!r}"
            )


class _DictMaker:
    """`dict(...)` inside templates, without exposing the dict type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes <, >, & and ' for HTML; chat templates want plain JSON.
    if indent is not None and not (isinstance(indent, int) and 0 <= indent <= 16):
        raise TemplateLimitError(f"tojson indent must be an integer in [0, 16], got {indent!r}")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    for name, fn in list(env.filters.items()):
        env.filters[name] = _bounded_filter(name, fn)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictMaker()
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def _plain(value: Any) -> Any:
    """Plain JSON-like data for the template: records become their chat dicts."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Message | ToolCall):
        return _plain(value.to_dict())
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and not isinstance(value, type):  # pydantic (OpenAI SDK messages)
        return _plain(model_dump())
    return f"<{type(value).__name__}>"


def _normalize_message(message: Any) -> dict:
    msg = _plain(message)
    if not isinstance(msg, dict):
        raise TypeError(f"a chat message must be a dict, a Message or a pydantic model, got "
                        f"{type(message).__name__}")
    msg = {k: v for k, v in msg.items() if v is not None}  # as transformers: None means absent
    reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
    if reasoning is not None:  # older names for the reasoning field, as transformers aliases them
        msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
    return msg


@dataclasses.dataclass(frozen=True, eq=False)
class ChatTemplate:
    """A compiled chat template plus the special-token variables it may read.

    Args:
      source: the jinja text (a `chat_template` from tokenizer_config.json or chat_template.jinja).
      bos_token / eos_token: strings exposed to the template as `bos_token` / `eos_token`.
      special_tokens: other named special tokens (`pad_token`, `unk_token`, ...).
      max_chars: bound on the rendered text and on every value the template builds.
      timeout_s: bound on the time of one render.
    """

    source: str
    bos_token: str | None = dataclasses.field(default=None, kw_only=True)
    eos_token: str | None = dataclasses.field(default=None, kw_only=True)
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict, kw_only=True)
    max_chars: int = dataclasses.field(default=4_000_000, kw_only=True)
    timeout_s: float = dataclasses.field(default=10.0, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError("ChatTemplate needs the jinja source text of a chat template, got an empty value")
        if not self.max_chars > 0 or not self.timeout_s > 0:
            raise ValueError(f"ChatTemplate max_chars and timeout_s must be > 0, got {self.max_chars}, {self.timeout_s}")
        try:
            _compile(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"chat template does not compile (line {e.lineno}): {e.message}") from e

    def variables(self) -> dict[str, str]:
        """The special-token variables passed to every render."""
        out = {k: v for k, v in self.special_tokens.items() if v is not None}
        if self.bos_token is not None:
            out["bos_token"] = self.bos_token
        if self.eos_token is not None:
            out["eos_token"] = self.eos_token
        return out

    def render(
        self,
        messages: Sequence[Mapping[str, Any] | Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **extra: Any,
    ) -> str:
        """Render a conversation to text, as `transformers.apply_chat_template(tokenize=False)`.

        Args:
          messages: chat dicts (`Message.to_dict()` form), `Message` records, or pydantic
            message objects such as the OpenAI SDK's (rendered as their `model_dump()`).
          tools: OpenAI function-format tool schemas, or None.
          add_generation_prompt: append the header that starts an assistant turn.
          **extra: further template variables (`enable_thinking`, `date_string`, `documents`...);
            they override the special-token variables of the same name.

        Returns:
          The rendered text.

        Raises:
          TemplateLimitError: the output or a value exceeded `max_chars`, or the render took
            longer than `timeout_s`.
        """
        chat = [_normalize_message(m) for m in messages]
        kwargs = {**self.variables(), **{k: _plain(v) for k, v in extra.items()}}
        kwargs.setdefault("documents", None)
        tool_schemas = None if tools is None else [_plain(t) for t in tools]
        template = _compile(self.source)
        token = _MAX_CHARS.set(self.max_chars)
        parts, size = [], 0
        try:
            with _Watchdog(self.timeout_s):
                for chunk in template.generate(
                    messages=chat, tools=tool_schemas, add_generation_prompt=add_generation_prompt, **kwargs
                ):
                    size += len(chunk)
                    if size > self.max_chars:
                        raise TemplateLimitError(
                            f"chat template output is longer than max_chars={self.max_chars}; "
                            "raise ChatTemplate.max_chars if the template is trusted"
                        )
                    parts.append(chunk)
        except _TemplateTimeout:
            raise TemplateLimitError(
                f"chat template took longer than timeout_s={self.timeout_s}; raise "
                "ChatTemplate.timeout_s if the template is trusted"
            ) from None
        finally:
            _MAX_CHARS.reset(token)
        return "".join(parts)
