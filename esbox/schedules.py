"""Schedules for sigma and the learning rate, indexed by step: step t uses ``schedule(t)``."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

from esbox.errors import ConfigError, close_match_hint, unknown_key_message


@dataclass(frozen=True)
class Constant:
    """The same value at every step."""

    value: float

    def __call__(self, step: int) -> float:
        return float(self.value)


@dataclass(frozen=True)
class _Annealed(ABC):
    """From ``start`` to ``end`` over ``steps`` steps (then ``end``), after a linear warm-up."""

    start: float
    end: float
    steps: int
    warmup: int = 0

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return self.start * (step + 1) / self.warmup
        frac = min(max(step - self.warmup, 0) / max(self.steps - self.warmup, 1), 1.0)
        return self._interpolate(frac)

    @abstractmethod
    def _interpolate(self, frac: float) -> float:
        """The value at fraction ``frac`` in [0, 1] of the annealing."""


@dataclass(frozen=True)
class Linear(_Annealed):
    """Linear interpolation from ``start`` to ``end``."""

    def _interpolate(self, frac: float) -> float:
        return self.start + (self.end - self.start) * frac


@dataclass(frozen=True)
class Cosine(_Annealed):
    """``end + (start - end)(1 + cos(pi t / T)) / 2``: the Agentic ESOpt sigma decay.

    With ``end`` = sigma_min this is sigma_t = sigma_min + (sigma_0 - sigma_min)(1 + cos(pi t/T))/2.
    """

    def _interpolate(self, frac: float) -> float:
        return self.end + 0.5 * (self.start - self.end) * (1.0 + math.cos(math.pi * frac))


Schedule = Constant | Linear | Cosine
SCHEDULES: dict[str, type] = {"constant": Constant, "linear": Linear, "cosine": Cosine}
ScheduleLike = float | int | dict | Schedule


SCHEDULE_FORM = (
    "a number, or a mapping {kind: constant, value: V} or "
    "{kind: linear|cosine, start: S, end: E, steps: T, warmup: W}"
)
_KEYS = {"constant": ("value",), "linear": ("start", "end", "steps", "warmup")}
_KEYS["cosine"] = _KEYS["linear"]


def make_schedule(spec: ScheduleLike, name: str = "schedule", positive: bool = False) -> Schedule:
    """A schedule from a number (constant), a dict ``{kind: cosine, start: ..}`` or a schedule.

    Values must be finite and >= 0 (> 0 with ``positive``, as sigma must be); a bad spec is a
    ConfigError naming ``name`` and the allowed form.
    """
    if isinstance(spec, (Constant, Linear, Cosine)):
        schedule = spec
    elif isinstance(spec, bool) or not isinstance(spec, (int, float, dict)):
        raise ConfigError(f"{name} must be {SCHEDULE_FORM}; got {spec!r:.80}")
    elif isinstance(spec, (int, float)):
        schedule = Constant(float(spec))
    else:
        schedule = _from_mapping(dict(spec), name)
    _check_values(schedule, name, positive)
    return schedule


def _from_mapping(options: dict[Any, Any], name: str) -> Schedule:
    kind = options.pop("kind", "constant")
    if not isinstance(kind, str) or kind not in SCHEDULES:
        hint = close_match_hint(str(kind), SCHEDULES)
        raise ConfigError(
            f"{name}.kind {kind!r:.40} is unknown{hint} (allowed: {', '.join(SCHEDULES)})"
        )
    allowed = _KEYS[kind]
    for key in options:
        if key not in allowed:
            yaml_hint = (
                "; in YAML put a space after each colon ({kind: cosine})" if ":" in str(key) else ""
            )
            message = unknown_key_message(f"{kind}-schedule key", str(key), allowed)
            raise ConfigError(f"{name}: {message}{yaml_hint}")
    missing = [key for key in allowed if key not in options and key != "warmup"]
    if missing:
        raise ConfigError(
            f"{name}: bad options for a {kind} schedule: missing {', '.join(missing)} "
            f"(it takes {', '.join(allowed)}; {name} is {SCHEDULE_FORM})"
        )
    for key, value in options.items():
        integer = key in ("steps", "warmup")
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok:
            kind_text = "an integer" if integer else "a number"
            raise ConfigError(f"{name}.{key} must be {kind_text}, got {value!r:.80}")
    return SCHEDULES[kind](**options)


def _check_values(schedule: Schedule, name: str, positive: bool) -> None:
    values = {k: v for k, v in asdict(schedule).items() if k in ("value", "start", "end")}
    rel = ">" if positive else ">="
    for key, v in values.items():
        label = name if key == "value" else f"{name}.{key}"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{label} must be a finite number {rel} 0, got {v!r:.80}")
        if v < 0 or (positive and v == 0):
            raise ConfigError(f"{label} must be {rel} 0, got {v}")
    if getattr(schedule, "steps", 1) < 1:
        raise ConfigError(f"{name}.steps must be >= 1, got {schedule.steps}")  # type: ignore[union-attr]
    if getattr(schedule, "warmup", 0) < 0:
        raise ConfigError(f"{name}.warmup must be >= 0, got {schedule.warmup}")  # type: ignore[union-attr]


def schedule_to_config(schedule: Schedule) -> float | dict[str, Any]:
    """The YAML/JSON form of a schedule (a plain number for a constant)."""
    if isinstance(schedule, Constant):
        return schedule.value
    kind = next(k for k, cls in SCHEDULES.items() if isinstance(schedule, cls))
    return {"kind": kind, **asdict(schedule)}
