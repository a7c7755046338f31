"""Schedules for sigma and the learning rate, indexed by step: step t uses ``schedule(t)``."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

from esbox.errors import ConfigError


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


def make_schedule(spec: ScheduleLike, name: str = "schedule") -> Schedule:
    """A schedule from a number (constant), a dict ``{kind: cosine, start: ..}`` or a schedule."""
    if isinstance(spec, (Constant, Linear, Cosine)):
        schedule = spec
    elif isinstance(spec, bool) or not isinstance(spec, (int, float, dict)):
        raise ConfigError(f"{name} must be a number or a schedule mapping, got {spec!r}")
    elif isinstance(spec, (int, float)):
        schedule = Constant(float(spec))
    else:
        options = dict(spec)
        kind = options.pop("kind", "constant")
        if kind not in SCHEDULES:
            raise ConfigError(f"{name}.kind '{kind}' is unknown (allowed: {', '.join(SCHEDULES)})")
        try:
            schedule = SCHEDULES[kind](**options)
        except TypeError as exc:
            raise ConfigError(f"{name}: bad options for a {kind} schedule: {exc}") from None
    _check_positive(schedule, name)
    return schedule


def _check_positive(schedule: Schedule, name: str) -> None:
    values = [v for k, v in asdict(schedule).items() if k in ("value", "start", "end")]
    if any(not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 for v in values):
        raise ConfigError(f"{name} values must be finite and >= 0, got {asdict(schedule)}")
    if getattr(schedule, "steps", 1) < 1 or getattr(schedule, "warmup", 0) < 0:
        raise ConfigError(f"{name}: steps must be >= 1 and warmup >= 0, got {asdict(schedule)}")


def schedule_to_config(schedule: Schedule) -> float | dict[str, Any]:
    """The YAML/JSON form of a schedule (a plain number for a constant)."""
    if isinstance(schedule, Constant):
        return schedule.value
    kind = next(k for k, cls in SCHEDULES.items() if isinstance(schedule, cls))
    return {"kind": kind, **asdict(schedule)}
