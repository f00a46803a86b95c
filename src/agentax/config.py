"""Strict construction of frozen config dataclasses from plain mappings (YAML, JSON, overrides).

Every config in agentax is a frozen, keyword-only dataclass. This module turns a nested
mapping into one, rejecting unknown keys with the nearest valid name, and back again.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = ["ConfigError", "check_values", "from_dict", "frozen", "to_dict", "replace"]

T = TypeVar("T")


def frozen(cls: type[T]) -> type[T]:
    """Class decorator: the frozen, keyword-only dataclass that every agentax config and record is."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


class ConfigError(ValueError):
    """A config value or key is invalid; the message says what to change."""


def _nearest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else f" Valid keys: {', '.join(sorted(valid))}."


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        options = [a for a in args if a is not type(None)]
        for arg in options:
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        if len(errors) == 1:  # `X | None`: X's own message says what fits
            raise ConfigError(errors[0] + (" (or null)" if len(options) < len(args) else ""))
        raise ConfigError(f"{where}: {value!r} does not fit {_type_name(tp)}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not allowed; choose one of {_allowed(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, _where=where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(args, value)))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        if len(args) == 2 and args[1] is not Any:  # `Mapping[str, float]`: each value typed
            return {k: _coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
        return dict(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            valid = [m.value for m in tp]
            raise ConfigError(f"{where}: {value!r} is not one of {valid}") from None
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{where}: {value!r} is not a finite number")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _allowed(args) -> str:
    return ", ".join(repr(a) for a in args)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check_field(name: str, value: Any, tp: Any, where: str) -> None:
    """Rules that hold for every config field, whatever dataclass it sits in.

    A Literal field holds one of its values; a float is finite, also inside a mapping or list
    field (`*_kwargs`) at any depth; a `*timeout_s` is > 0 and any other `*_s` duration >= 0;
    an int (other than a seed) is >= 0 — every count, size and period in agentax uses 0, never
    a negative number, for "off" or "default".
    """
    if value is None:
        return
    if isinstance(value, (Mapping, list, tuple)):
        _check_finite(value, where, set(), spelled=name == "kwargs" or name.endswith("_kwargs"))
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) != 1:
            return
        tp = options[0]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not allowed; choose one of {_allowed(args)}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value!r} is not a finite number")
    if name.endswith("timeout_s"):
        if value <= 0:
            raise ConfigError(f"{where} must be > 0 seconds, got {value}")
    elif name.endswith("_s") and value < 0:
        raise ConfigError(f"{where} must be >= 0 seconds, got {value}")
    elif isinstance(value, int) and "seed" not in name and value < 0:
        raise ConfigError(f"{where} must be >= 0, got {value}")


def _check_finite(value: Any, where: str, seen: set[int], *, spelled: bool = False) -> None:
    """Every float inside `value` (mappings and lists, at any depth) is finite.

    A mapping field such as `trainer.advantage_kwargs` holds whatever the user wrote, so
    `{eps: .nan}` would otherwise reach the code it configures unchecked. With `spelled` (the
    `*_kwargs` fields) a string that spells a non-finite number is refused too: YAML reads
    `{eps: nan}` as the string 'nan', which `float()` in the code it configures turns into a
    NaN. `seen` keeps a container that is shared (a YAML alias) or that contains itself from
    being walked twice.
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {value!r} is not a finite number")
        return
    if isinstance(value, str):
        if spelled and _NON_FINITE.fullmatch(value.strip()):
            raise ConfigError(f"{where}: {value!r} spells a non-finite number (NaN / infinity); "
                              "give a finite number")
        return
    if not isinstance(value, (Mapping, list, tuple)) or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}", seen, spelled=spelled)
    else:
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]", seen, spelled=spelled)


_NON_FINITE = re.compile(r"[+-]?\.?(nan|inf|infinity)", re.IGNORECASE)
"""What `float()` or YAML reads as NaN / infinity: nan, -inf, Infinity, .NaN, -.inf, ..."""


def check_values(obj: Any, *, where: str = "") -> None:
    """Applies the per-field rules (see `_check_field`) to a config dataclass, recursively.

    Raises:
      ConfigError: naming the first field that breaks a rule, and what it may hold.
    """
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        value = getattr(obj, f.name)
        path = f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_values(value, where=path)
        else:
            _check_field(f.name, value, hints.get(f.name, Any), path)


def from_dict(cls: type[T], data: Mapping[str, Any], *, _where: str = "") -> T:
    """Builds dataclass `cls` from `data`, strictly.

    Raises:
      ConfigError: on an unknown key (naming the nearest valid one) or a value of the wrong type.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where or cls.__name__}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        where = f"{_where}.{key}" if _where else key
        if key not in fields:
            raise ConfigError(f"unknown config key '{where}'.{_nearest(key, list(fields))}")
        kwargs[key] = _coerce(value, hints[key], where)
        _check_field(key, kwargs[key], hints[key], where)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{_where or cls.__name__}: {e}") from e


def to_dict(obj: Any) -> Any:
    """Serializes a config dataclass (recursively) to plain YAML-able values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def replace(obj: T, **changes: Any) -> T:
    """`dataclasses.replace` with the same strict checks as `from_dict`."""
    data = {k: getattr(obj, k) for k in (f.name for f in dataclasses.fields(obj) if f.init)}
    for k, v in changes.items():
        data[k] = v
    return from_dict(type(obj), data)
