"""Chat templates: render a model's own jinja chat template without `transformers`.

The jinja environment is configured the way `transformers.apply_chat_template` configures it
(sandboxed, `trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter
that does not escape HTML and accepts `indent` / `separators` / `sort_keys`, the globals
`raise_exception` and `strftime_now`, and namespaces that refuse underscore names), so a
template renders to the same text here as there. `{% generation %}` blocks are accepted and
render their body (assistant masks come from `render_conversation`, which works for every
template, not only those that mark generation blocks).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agentax.records import Message, ToolCall

__all__ = ["ChatTemplate"]

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
        jinja2.utils.Namespace.__setitem__(self, name, value)

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
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
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
    return f"<{type(value).__name__}>"


def _normalize_message(message: Any) -> dict:
    msg = _plain(message)
    if not isinstance(msg, dict):
        raise TypeError(f"a chat message must be a dict or a Message, got {type(message).__name__}")
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
    """

    source: str
    bos_token: str | None = dataclasses.field(default=None, kw_only=True)
    eos_token: str | None = dataclasses.field(default=None, kw_only=True)
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError("ChatTemplate needs the jinja source text of a chat template, got an empty value")
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
          messages: chat dicts (`Message.to_dict()` form) or `Message` records.
          tools: OpenAI function-format tool schemas, or None.
          add_generation_prompt: append the header that starts an assistant turn.
          **extra: further template variables (`enable_thinking`, `date_string`, `documents`...);
            they override the special-token variables of the same name.

        Returns:
          The rendered text.
        """
        chat = [_normalize_message(m) for m in messages]
        kwargs = {**self.variables(), **{k: _plain(v) for k, v in extra.items()}}
        kwargs.setdefault("documents", None)
        tool_schemas = None if tools is None else [_plain(t) for t in tools]
        return _compile(self.source).render(
            messages=chat, tools=tool_schemas, add_generation_prompt=add_generation_prompt, **kwargs
        )
