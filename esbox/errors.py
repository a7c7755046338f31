"""Exceptions that name what is wrong and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or out of range."""


class ResumeError(RuntimeError):
    """A checkpoint cannot be resumed faithfully (wrong strategy, config or seed stream)."""


class ConfigWarning(UserWarning):
    """A configuration that runs but probably not as meant (e.g. more subspaces than weights)."""


class RewardError(RuntimeError):
    """The objective gave no usable reward: no finite reward in a step (or several in a row)."""


class RewardTypeError(RewardError, TypeError):
    """The objective returned something that is not a number (None, a string, ...)."""


def check_reward_values(values: object, what: str = "the objective") -> None:
    """Raise RewardTypeError unless ``values`` are numbers (a string such as "1.0" is not)."""
    import numpy as np

    try:
        array = np.asarray(values)
    except (TypeError, ValueError):
        array = np.asarray(values, dtype=object)
    if array.dtype.kind not in "biuf":
        items = values if isinstance(values, (list, tuple)) else array.reshape(-1).tolist()
        bad = values if array.ndim == 0 else next((v for v in items if not _is_number(v)), values)
        raise RewardTypeError(
            f"{what} returned {type(bad).__name__} {bad!r:.60}, not a number; "
            f"it must return a real number (int or float) for every input"
        )


def _is_number(value: object) -> bool:
    import numbers

    return isinstance(value, numbers.Real)


def close_match_hint(value: str, allowed: Iterable[str]) -> str:
    """``; did you mean 'x'?`` when ``value`` is close to one of ``allowed``, else ``""``."""
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def unknown_key_message(kind: str, key: str, allowed: Iterable[str]) -> str:
    """``unknown <kind> 'key'; did you mean 'x'? allowed: a, b, c``."""
    allowed = sorted(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown {kind} '{key}'{hint} (allowed: {', '.join(allowed)})"


def check_foreign_keys(
    section: Iterable[str],
    where: str,
    *,
    own: dict[str, str] | None = None,
    allowed: Iterable[str] | None = None,
    what: str = "known key",
) -> None:
    """Keys of a section handed to another library's config class (vLLM's ``EngineArgs``,
    TRL's ``GRPOConfig``): none that esbox sets itself (``own``: key -> where it comes from),
    and, given ``allowed``, each one of its fields; the ConfigError names the key."""
    for key in section:
        if own and key in own:
            raise ConfigError(f"{where}.{key} is set by esbox ({own[key]})")
    if allowed is None:
        return
    allowed = sorted(allowed)
    for key in section:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(f"{where}.{key} is not a {what}{hint}")
