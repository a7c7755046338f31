"""SNES: separable natural evolution strategies (Schaul, Glasmachers and Schmidhuber 2011).

A diagonal Gaussian N(theta, diag(sigma s)^2) with per-coordinate scales s held by the space:
members theta + sigma s * eps_i, NES utilities u_i (``shaping="utilities"``), and natural
gradient steps on both the mean and the log-scales:

    theta <- theta + eta_mu sigma s * sum_i u_i eps_i
    s     <- s * exp(eta_sigma / 2 * sum_i u_i (eps_i^2 - 1))

with eta_sigma = (3 + ln d) / (5 sqrt d). As a spec the update's terms are (seed_i, sigma u_i),
its learning rate eta_mu, and it is ``diagonal`` with scale terms (seed_i, eta_sigma u_i / 2):
seeds and scalars only, replayed by every replica.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from esbox.config import option
from esbox.registry import register
from esbox.schedules import ScheduleLike
from esbox.shaping import SHAPINGS
from esbox.specs import Perturbation, Term, Update
from esbox.strategy import SIGMA_FORM, Strategy, StrategyOptions


@register("snes")
class SNES(Strategy):
    """Separable NES: a per-coordinate sigma adapted by the natural gradient, kept in the space."""

    description = "SNES: separable natural ES, per-coordinate sigma adapted in the space"
    adapts_sigma = True

    @dataclass
    class Options(StrategyOptions):
        sigma: ScheduleLike = option(
            1.0, "initial sigma, scaled per coordinate by the adapted s", form=SIGMA_FORM
        )
        learning_rate: ScheduleLike = option(1.0, "eta_mu, the mean's natural-gradient rate")
        shaping: str = option("utilities", "reward shaping", choices=SHAPINGS)
        sigma_rate: float | None = option(
            None, "eta_sigma of the log-scale update (null: (3 + ln d) / (5 sqrt d))", minimum=0.0
        )

    @property
    def sigma_rate(self) -> float:
        """eta_sigma: the option, or SNES's default for this dimension."""
        if self.options.sigma_rate is not None:
            return self.options.sigma_rate
        return (3 + math.log(self.dimension)) / (5 * math.sqrt(self.dimension))

    def _ask(self, sigma: float) -> list[Perturbation]:
        return [
            Perturbation(self.seed, self.step, seed, sigma, diagonal=True)
            for seed in self.draw_seeds(self.options.population)
        ]

    def _terms(self, perturbations: Sequence[Perturbation], shaped: np.ndarray) -> list[Term]:
        # theta moves by eta_mu sigma s sum u_i eps_i: sigma rides on the coefficients
        return [
            Term(p.seed, abs(p.scale) * float(u))
            for p, u in zip(perturbations, shaped, strict=True)
        ]

    def tell(self, rewards: Sequence[float] | np.ndarray) -> Update:
        """As ``Strategy.tell``; the update is diagonal and also moves the scales s."""
        sigma = abs(self._pending[0].scale) if self._pending else 1.0
        update = super().tell(rewards)
        rate = self.sigma_rate / (2 * sigma)  # a term's coefficient is sigma u_i
        scale_terms = tuple(Term(t.seed, rate * t.coefficient) for t in update.terms)
        return dataclasses.replace(update, diagonal=True, scale_terms=scale_terms)
