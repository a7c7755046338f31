"""Checks of task options: each returns the value or raises a ConfigError naming
``problem.task.<key>`` and what is allowed."""

from __future__ import annotations

from typing import Any

from esbox.errors import ConfigError


def check_int(key: str, value: Any, low: int) -> int:
    """``value`` as an integer >= ``low``, else a ConfigError naming ``problem.task.<key>``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"problem.task.{key} must be an integer >= {low}, got {value!r}")
    return value


def check_positive(key: str, value: Any) -> float:
    """``value`` as a number > 0, else a ConfigError naming ``problem.task.<key>``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"problem.task.{key} must be a number > 0, got {value!r}")
    return float(value)


def check_fraction(key: str, value: Any) -> float:
    """``value`` as a number in [0, 1), else a ConfigError naming ``problem.task.<key>``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"problem.task.{key} must be a number in [0, 1), got {value!r}")
    return float(value)
