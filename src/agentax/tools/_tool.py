"""`Tool`: a typed Python function the model can call, with a JSON schema and a bounded call.

A `Tool` is built from a function's signature and docstring (`tool(...)`). Calling it never
raises into the caller: bad arguments, exceptions, timeouts and runaway output all come back as
a `ToolResult` with `ok=False`, a short `error` kind and a message the model can read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import inspect
import json
import re
import time
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agentax._executors import stage_executor
from agentax.records import ToolResult

__all__ = ["Tool", "tool", "truncate_output", "DEFAULT_MAX_OUTPUT_CHARS"]

DEFAULT_MAX_OUTPUT_CHARS = 8000
"""Default cap on the text a tool hands back to the model."""


def truncate_output(text: str, max_chars: int) -> str:
    """Keeps the head and the tail of `text` within `max_chars`, with a marker in between.

    The marker says how many characters were dropped, so the model knows output is missing.
    """
    if len(text) <= max_chars:
        return text
    marker = f"\n...[truncated {len(text) - max_chars} characters]...\n"
    keep = max(0, max_chars - len(marker))
    head = keep * 2 // 3
    tail = keep - head
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


# ----------------------------------------------------------------------------- schema


def _json_type(tp: Any, where: str) -> dict[str, Any]:
    """JSON schema of one annotation; raises TypeError for types a model cannot send."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return {}
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _json_type(rest[0], where)
        return {"anyOf": [_json_type(a, where) for a in rest]}
    if tp in (list, tuple) or origin in (list, tuple, typing.Sequence):
        item = args[0] if args else Any
        return {"type": "array", "items": _json_type(item, where)}
    if tp is dict or origin in (dict, Mapping):
        return {"type": "object"}
    raise TypeError(f"{where}: annotation {tp!r} has no JSON schema; use str/int/float/bool/list/dict")


_ARG_SECTIONS = ("args", "arguments", "parameters", "params")
_OTHER_SECTIONS = ("returns", "return", "raises", "yields", "example", "examples", "note", "notes")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Splits a Google-style docstring into (description, {arg: description})."""
    doc = inspect.cleandoc(doc or "")
    lines = doc.splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section = None
    current = None
    arg_indent = -1
    for line in lines:
        stripped = line.strip()
        header = stripped.rstrip(":").lower()
        if stripped.endswith(":") and header in _ARG_SECTIONS:
            section, current, arg_indent = "args", None, -1
            continue
        if stripped.endswith(":") and header in _OTHER_SECTIONS:
            section, current = "other", None
            continue
        if section is None:
            description.append(line)
        elif section == "args" and stripped:
            indent = len(line) - len(line.lstrip())
            m = _ARG_LINE.match(line)
            if m and (arg_indent < 0 or indent <= arg_indent):
                current, arg_indent = m.group(1).lstrip("*"), indent
                params[current] = m.group(2).strip()
            elif current:
                params[current] = (params[current] + " " + stripped).strip()
    text = "\n".join(description).strip()
    return text, params


def _build_schema(fn: Callable[..., Any], arg_docs: Mapping[str, str]) -> dict[str, Any]:
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model")
        if pname not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter '{pname}' needs a type annotation")
        prop = _json_type(hints[pname], f"tool {fn.__name__}, parameter '{pname}'")
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        if param.default is param.empty:
            required.append(pname)
        elif param.default is None or isinstance(param.default, (str, int, float, bool)):
            prop["default"] = param.default
        properties[pname] = prop
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


# ----------------------------------------------------------------------------- validation


def _check_value(value: Any, schema: Mapping[str, Any], where: str) -> Any:
    """Checks (and mildly coerces) one argument against its schema; raises ValueError."""
    if "enum" in schema:
        if value not in schema["enum"]:
            raise ValueError(f"{where} must be one of {schema['enum']}, got {value!r}")
        return value
    if "anyOf" in schema:
        for sub in schema["anyOf"]:
            try:
                return _check_value(value, sub, where)
            except ValueError:
                pass
        raise ValueError(f"{where} has the wrong type: {value!r}")
    kind = schema.get("type")
    if kind is None or value is None and "default" in schema and schema["default"] is None:
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {type(value).__name__}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {value!r}")
    elif kind == "integer":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {value!r}")
        value = float(value)
    elif kind == "array":
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} must be a list, got {type(value).__name__}")
        items = schema.get("items", {})
        value = [_check_value(v, items, f"{where}[{i}]") for i, v in enumerate(value)]
    elif kind == "object":
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} must be an object, got {type(value).__name__}")
        value = dict(value)
    return value


def _validate(arguments: Any, parameters: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(arguments, str):  # some parsers hand the raw JSON string through
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments are not valid JSON: {e}") from None
    if not isinstance(arguments, Mapping):
        raise ValueError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    props = parameters.get("properties", {})
    unknown = sorted(set(arguments) - set(props))
    if unknown and parameters.get("additionalProperties", True) is False:
        raise ValueError(f"unknown argument(s) {unknown}; expected {sorted(props)}")
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        raise ValueError(f"missing required argument(s) {missing}")
    return {k: _check_value(v, props.get(k, {}), f"argument '{k}'") for k, v in arguments.items()}


# ----------------------------------------------------------------------------- Tool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tool:
    """A callable the model can invoke by name with JSON arguments.

    `fn` may be sync (run on the bounded "tool" thread pool, so it never blocks the event loop) or
    async. It may return a string, a JSON-serialisable value, or a `ToolResult` (to report
    `ok=False` itself). Note: a sync function that ignores the timeout keeps its executor
    thread busy until it returns; for code that may hang use the sandbox tools.
    """

    name: str
    """Name the model calls the tool by."""
    description: str
    """What the tool does, shown to the model."""
    parameters: Mapping[str, Any]
    """JSON schema (type "object") of the arguments."""
    fn: Callable[..., Any] = dataclasses.field(repr=False)
    """The implementation; receives the validated arguments as keyword arguments."""
    timeout_s: float = 10.0
    """Wall-clock bound of one call."""
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    """Output beyond this many characters is cut, with a marker saying how much."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", self.name):
            raise ValueError(f"tool name {self.name!r} must be 1-64 chars of letters, digits, _ . -")
        if self.timeout_s <= 0:
            raise ValueError(f"tool {self.name}: timeout_s must be > 0, got {self.timeout_s}")
        if self.max_output_chars < 64:
            raise ValueError(f"tool {self.name}: max_output_chars must be >= 64")
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name}: parameters must be a JSON schema of type 'object'")

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling form, as chat templates expect it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def _result(self, content: str, call_id: str, t0: float, error: str | None = None) -> ToolResult:
        return ToolResult(
            name=self.name,
            content=truncate_output(content, self.max_output_chars),
            call_id=call_id,
            ok=error is None,
            error=error,
            elapsed_s=time.monotonic() - t0,
        )

    async def call(self, arguments: Mapping[str, Any] | str, *, call_id: str = "") -> ToolResult:
        """Runs the tool; never raises (except for cancellation of the calling task)."""
        t0 = time.monotonic()
        try:
            kwargs = _validate(arguments, self.parameters)
        except ValueError as e:
            return self._result(f"Error: bad arguments for tool '{self.name}': {e}", call_id, t0, "bad_arguments")
        try:
            if inspect.iscoroutinefunction(self.fn):
                pending: Awaitable[Any] = self.fn(**kwargs)
            else:
                loop = asyncio.get_running_loop()
                pending = loop.run_in_executor(stage_executor("tool"), functools.partial(self.fn, **kwargs))
            value = await asyncio.wait_for(pending, timeout=self.timeout_s)
        except asyncio.TimeoutError:
            return self._result(
                f"Error: tool '{self.name}' timed out after {self.timeout_s:g} s", call_id, t0, "timeout"
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the tool's own bug or refusal: the model sees it, the loop survives
            return self._result(f"Error: tool '{self.name}' failed: {type(e).__name__}: {e}", call_id, t0, "crashed")
        if isinstance(value, ToolResult):
            return dataclasses.replace(
                value,
                name=self.name,
                call_id=call_id,
                content=truncate_output(value.content, self.max_output_chars),
                elapsed_s=time.monotonic() - t0,
            )
        if isinstance(value, str):
            text = value
        else:
            try:
                text = json.dumps(value, ensure_ascii=False, default=str)
            except (TypeError, ValueError):
                text = str(value)
        return self._result(text, call_id, t0)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = 10.0,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> Any:
    """Builds a `Tool` from a typed function; usable as `@tool` or `@tool(name=..., ...)`.

    The JSON schema comes from the annotations (str, int, float, bool, list[...], dict,
    Literal[...], Optional[...]); parameters without a default are required. The description
    is the docstring's text before its sections; the `Args:` section describes parameters.

    Raises:
        TypeError: a parameter lacks an annotation or has a type with no JSON form.
    """

    def build(f: Callable[..., Any]) -> Tool:
        doc_text, arg_docs = _parse_docstring(f.__doc__ or "")
        return Tool(
            name=name or f.__name__,
            description=description if description is not None else doc_text,
            parameters=_build_schema(f, arg_docs),
            fn=f,
            timeout_s=timeout_s,
            max_output_chars=max_output_chars,
        )

    return build if fn is None else build(fn)
