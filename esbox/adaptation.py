"""Sigma adaptation by the population success rule, usable by any strategy.

The rule needs nothing but rewards (Loshchilov 2014, the "rank-based success rule" of LM-CMA;
Ait Elhara et al. 2013): rank the rewards of this step's population together with the last
step's; z = (R_now - R_before) / N^2 - target, with R the sum of a population's ranks
(higher reward, higher rank; ties share theirs); s <- (1 - c) s + c z;
sigma <- sigma exp(s / damping). When the new population beats the old one more often than
``target`` says, steps are paying and sigma grows; otherwise it shrinks. It keeps N floats
and two numbers.

While sigma adapts, the learning rate follows it (``rate_factor``): lr_t = lr_0 (sigma_t /
sigma_0)^p, so a step stays proportional to sigma (p = 2 for the canonical 1/sigma estimate,
p = 1 for reward-weighted updates).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from esbox.errors import ConfigError, unknown_key_message
from esbox.shaping import centered_ranks

ADAPTIVE_FORM = "{kind: adaptive, initial: S0, target: 0.25, smoothing: 0.3, damping: 1.0}"


@dataclass(frozen=True)
class SuccessRule:
    """The rule's settings: starting sigma and the success-rule constants."""

    initial: float = 1.0
    target: float = 0.25
    smoothing: float = 0.3
    damping: float = 1.0

    @classmethod
    def from_config(cls, spec: Mapping[str, Any], name: str = "sigma") -> SuccessRule:
        """From ``{kind: adaptive, initial: .., ...}``; a bad key or value names it."""
        settings = {k: v for k, v in spec.items() if k != "kind"}
        allowed = tuple(asdict(cls()))
        for key, value in settings.items():
            if key not in allowed:
                raise ConfigError(
                    f"{name}: {unknown_key_message('adaptive-sigma key', str(key), allowed)}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name}.{key} must be a number, got {value!r:.80}")
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name}.{key} must be a finite number > 0, got {value}")
        rule = cls(**{k: float(v) for k, v in settings.items()})
        if not 0 < rule.target < 1 or not 0 < rule.smoothing <= 1:
            raise ConfigError(
                f"{name}: target must be in (0, 1) and smoothing in (0, 1], "
                f"got {rule.target} and {rule.smoothing}"
            )
        return rule

    def to_config(self) -> dict[str, Any]:
        return {"kind": "adaptive", **asdict(self)}


def is_adaptive(spec: Any) -> bool:
    """True for a sigma option of the form ``{kind: adaptive, ...}``."""
    return isinstance(spec, Mapping) and spec.get("kind") == "adaptive"


class SigmaAdaptation:
    """The running state of a ``SuccessRule``: sigma now, the smoothed success, last rewards."""

    def __init__(self, rule: SuccessRule) -> None:
        self.rule = rule
        self.sigma = rule.initial
        self.success = 0.0
        self.previous: np.ndarray | None = None

    def rate_factor(self, power: int) -> float:
        """(sigma_t / sigma_0)^power: how much the learning rate follows sigma."""
        return (self.sigma / self.rule.initial) ** power

    def observe(self, rewards: np.ndarray) -> None:
        """Update sigma from this step's (finite) rewards against the last step's."""
        rewards = np.asarray(rewards, dtype=np.float64)
        if self.previous is not None and self.previous.size == rewards.size:
            n = rewards.size
            both = np.concatenate([self.previous, rewards])
            ranks = (centered_ranks(both) + 0.5) * (2 * n - 1)  # ties share their rank
            z = (ranks[n:].sum() - ranks[:n].sum()) / n**2 - self.rule.target
            self.success = (1 - self.rule.smoothing) * self.success + self.rule.smoothing * z
            self.sigma *= math.exp(self.success / self.rule.damping)
        self.previous = rewards.copy()

    def state_dict(self) -> dict[str, Any]:
        previous = None if self.previous is None else [float(r) for r in self.previous]
        return {"sigma": self.sigma, "success": self.success, "previous": previous}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sigma = float(state["sigma"])
        self.success = float(state["success"])
        previous = state["previous"]
        self.previous = None if previous is None else np.asarray(previous, dtype=np.float64)
