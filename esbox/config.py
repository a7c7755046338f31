"""Typed option dataclasses: every option has a default, a type, a help text and a check."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, get_type_hints

from esbox.errors import ConfigError, close_match_hint, unknown_key_message


def option(
    default: Any,
    help: str,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
    exclusive_minimum: bool = False,
    form: str | None = None,
) -> Any:
    """A dataclass field carrying its help text, allowed choices, lower bound and, where the
    type alone does not say it, the allowed ``form`` in words (for error messages)."""
    meta = {
        "help": help,
        "choices": choices,
        "minimum": minimum,
        "exclusive": exclusive_minimum,
        "form": form,
    }
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_UNIONS = (typing.Union, types.UnionType)


def _accepts(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in _UNIONS:
        return any(_accepts(value, arg) for arg in typing.get_args(hint))
    if origin is not None:
        return isinstance(value, origin) and _items_accepted(value, origin, typing.get_args(hint))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _items_accepted(value: Any, origin: Any, args: tuple[Any, ...]) -> bool:
    """The items of a parametrised container match its type arguments (``list[int]``,
    ``tuple[float, ...]``, ``tuple[int, str]``, ``dict[str, float]``)."""
    if not args:
        return True
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_accepts(item, args[0]) for item in value)
        return len(value) == len(args) and all(map(_accepts, value, args))
    if origin is dict:
        return all(_accepts(k, args[0]) and _accepts(v, args[1]) for k, v in value.items())
    if origin in (list, set, frozenset):
        return all(_accepts(item, args[0]) for item in value)
    return True


def _from_yaml(value: Any, hint: Any) -> Any:
    """YAML has no tuples: a list given for a tuple-typed option becomes a tuple."""
    if not isinstance(value, list):
        return value
    options = typing.get_args(hint) if typing.get_origin(hint) in _UNIONS else (hint,)
    if any(arg is tuple or typing.get_origin(arg) is tuple for arg in options):
        return tuple(value)
    return value


def build_options(cls: type, values: dict[str, Any], where: str = "option") -> Any:
    """Instantiate option dataclass ``cls`` from ``values``, naming any bad key or value."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            raise ConfigError(unknown_key_message(where, key, fields))
    hints = get_type_hints(cls)
    values = {key: _from_yaml(value, hints[key]) for key, value in values.items()}
    for key, value in values.items():
        meta = fields[key].metadata
        if not _accepts(value, hints[key]):
            form = meta.get("form") or f"of type {_yaml_type_name(hints[key])}"
            raise ConfigError(f"{where} '{key}' must be {form}, got {value!r:.80}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where} '{key}' must be a finite number, got {value}")
        choices = meta.get("choices")
        if choices and (not isinstance(value, str) or value not in choices):
            hint = close_match_hint(str(value), choices)
            raise ConfigError(
                f"{where} '{key}' is {value!r:.80}{hint} (allowed: {', '.join(choices)})"
            )
        low = meta.get("minimum")
        if low is not None and isinstance(value, (int, float)):
            bad = value <= low if meta.get("exclusive") else value < low
            if bad:
                rel = ">" if meta.get("exclusive") else ">="
                raise ConfigError(f"{where} '{key}' must be {rel} {low}, got {value}")
    return cls(**values)


_NAMES = {dict: "mapping", type(None): "null", str: "str", int: "int", float: "float"}


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is None and hasattr(hint, "__name__"):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _yaml_type_name(hint: Any) -> str:
    """A type as a user writes it in YAML: ``int | null``, ``list``, ``mapping``."""
    origin = typing.get_origin(hint)
    if origin in _UNIONS:
        names = [_yaml_type_name(arg) for arg in typing.get_args(hint)]
        return " | ".join(dict.fromkeys(n for n in names if n))
    if origin is not None:  # list[int], tuple[int, ...]
        return _type_name(hint)
    if hint in _NAMES:
        return _NAMES[hint]
    if getattr(hint, "__module__", "") == "builtins":
        return hint.__name__
    return ""  # a Python class (e.g. a schedule object) is not something YAML can spell


def describe_options(cls: type) -> list[dict[str, Any]]:
    """Name, type, default, help and choices of every option (for ``esbox strategies``)."""
    hints = get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append(
            {
                "name": f.name,
                "type": _type_name(hints[f.name]),
                "default": default,
                "help": f.metadata.get("help", ""),
                "choices": f.metadata.get("choices"),
            }
        )
    return rows
