"""Exceptions that name what is wrong and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or out of range."""


class ResumeError(RuntimeError):
    """A checkpoint cannot be resumed faithfully (wrong strategy, config or seed stream)."""


def unknown_key_message(kind: str, key: str, allowed: Iterable[str]) -> str:
    """``unknown <kind> 'key'; did you mean 'x'? allowed: a, b, c``."""
    allowed = sorted(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown {kind} '{key}'{hint} (allowed: {', '.join(allowed)})"
