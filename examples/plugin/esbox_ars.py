"""ARS: Augmented Random Search, V1-t (Mania, Guy & Recht 2018, "Simple random search of static
linear policies is competitive for reinforcement learning").

Antithetic pairs theta +- nu delta_k; the b directions with the highest max(r+_k, r-_k) are
kept, and theta <- theta + alpha / (b sigma_R) sum_k (r+_k - r-_k) delta_k, where sigma_R is the
standard deviation of the 2b rewards kept. In esbox's canonical units (g = sum r_i eps_i /
(N nu)) the coefficient carries a further 1/(2 nu): learning_rate = 2 nu alpha. With all
directions kept and raw or z-score rewards this is OpenAI-ES with z-score shaping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import esbox
from esbox.config import option
from esbox.errors import ConfigError
from esbox.shaping import SHAPINGS
from esbox.specs import Perturbation, Term


class ARS(esbox.Strategy):
    """Random search on antithetic pairs: keep the best b, normalize by their rewards' std."""

    description = "ARS (V1-t): the top-b antithetic directions, scaled by their rewards' std"

    @dataclass
    class Options(esbox.StrategyOptions):
        shaping: str = option("raw", "reward shaping before selection (ARS: raw)", choices=SHAPINGS)
        top_directions: int = option(0, "directions b kept per step (0: all N/2)", minimum=0)

    @classmethod
    def population_multiple(cls, options: dict) -> int:
        return 2  # antithetic pairs: esbox's default population rounds up to an even size

    def _validate(self) -> None:
        pairs, top = self.options.population // 2, self.options.top_directions
        if self.options.population % 2:
            raise ConfigError(
                f"population must be even (antithetic pairs), got {self.options.population}"
            )
        if top > pairs:
            raise ConfigError(f"top_directions must be at most population/2 = {pairs}, got {top}")

    def _ask(self, sigma: float) -> list[Perturbation]:
        seeds = self.draw_seeds(self.options.population // 2)
        return [self.member(s, sign * sigma) for s in seeds for sign in (1.0, -1.0)]

    def _terms(self, perturbations: Sequence[Perturbation], shaped: np.ndarray) -> list[Term]:
        plus, minus = shaped[0::2], shaped[1::2]  # members come as (+delta_k, -delta_k) pairs
        b = self.options.top_directions or plus.size
        top = np.argsort(-np.maximum(plus, minus), kind="stable")[:b]
        std = float(np.concatenate([plus[top], minus[top]]).std())
        if std == 0.0:
            return []  # no reward differs among the kept directions: a zero update
        nu = abs(perturbations[0].scale)
        return [
            Term(perturbations[2 * k].seed, float(plus[k] - minus[k]) / (2 * b * nu * std))
            for k in top
        ]
