"""The termination criteria of a run on a vector (``tolx``, ``tolfun``, ``stagnation``) and the
``restarts:`` options that say what follows when one fires (``esbox.restarts``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from esbox.config import build_options, option
from esbox.errors import ConfigError

RESTART_KINDS = ("auto", "ipop", "bipop", "stop", "none")
START_KINDS = ("auto", "x0", "gaussian", "domain")


@dataclass
class RestartOptions:
    """When a run on a vector stops or restarts before its budget ends."""

    kind: str = option(
        "auto",
        "ipop or bipop: restart when a termination criterion fires; stop: end the run there; "
        "none: spend the whole budget; auto: ipop on vectors where sigma adapts, else none",
        choices=RESTART_KINDS,
    )
    max_restarts: int | None = option(
        None, "restarts at most, then stop (null: until the budget ends)", minimum=0
    )
    population_factor: float = option(2.0, "IPOP: population times this each restart", minimum=1)
    start: str = option(
        "auto",
        "a restart's start point: x0, gaussian (x0 + sigma_0 N(0, I)), domain (uniform in the "
        "function's domain); auto: domain where the problem has one, else gaussian",
        choices=START_KINDS,
    )
    tolx: float = option(1e-11, "stop when sigma < tolx max(1, rms(x))", minimum=0)
    tolfun: float = option(
        1e-11, "stop when the best improved by < tolfun (1 + |best|) in tolfun_steps", minimum=0
    )
    tolfun_steps: int | None = option(None, "k of tolfun (null: 10 + ceil(30 d / N))", minimum=1)
    stagnation_steps: int | None = option(
        None,
        "stop when the median reward of the newest 30% of this many steps is no better than "
        "that of the oldest 30% (null: 120 + ceil(30 d / N); 0: off)",
        minimum=0,
    )


def restart_options(value: Any) -> RestartOptions:
    """``RestartOptions`` from a kind (``"ipop"``), a mapping, None or False (``"none"``)."""
    if isinstance(value, RestartOptions):
        return value
    if value is None or value is False:
        return RestartOptions(kind="none")
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"restarts must be a kind, a mapping or None, got {value!r:.80}")
    return build_options(RestartOptions, dict(value), where="restarts key")


class Termination:
    """The criteria of one restart, checked after each step (see the module docstring)."""

    def __init__(self, options: RestartOptions, dimension: int, population: int) -> None:
        self.restart_options = options
        self.k = options.tolfun_steps or 10 + math.ceil(30 * dimension / population)
        window = options.stagnation_steps
        self.window = 120 + math.ceil(30 * dimension / population) if window is None else window
        self.bests: list[float] = []  # the restart's best reward after each of the last k steps
        self.medians: list[float] = []  # each step's median reward, the last ``window``

    def check(self, rewards: np.ndarray, sigma: float | None, x_rms: float) -> str | None:
        """The criterion that fires after a step with ``rewards`` (finite), or None."""
        best = max([*self.bests[-1:], float(rewards.max())]) if rewards.size else None
        if best is not None:
            self.bests = [*self.bests, best][-(self.k + 1) :]
            self.medians = [*self.medians, float(np.median(rewards))][-max(self.window, 1) :]
        if sigma is not None and sigma < self.restart_options.tolx * max(1.0, x_rms):
            return "tolx"
        if len(self.bests) > self.k:
            gain = self.bests[-1] - self.bests[0]
            if gain <= self.restart_options.tolfun * (1.0 + abs(self.bests[-1])):
                return "tolfun"
        if self.window and len(self.medians) >= self.window:
            part = max(1, math.ceil(0.3 * self.window))
            if np.median(self.medians[-part:]) <= np.median(self.medians[:part]):
                return "stagnation"
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"bests": list(self.bests), "medians": list(self.medians)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.bests = [float(v) for v in state["bests"]]
        self.medians = [float(v) for v in state["medians"]]
