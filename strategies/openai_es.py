"""OpenAI-ES (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to RL").

eps_i ~ N(0, I), antithetic pairs by default, r_i = F(theta + sigma eps_i), shaped rewards,
g = sum_i r_i eps_i / (N sigma), theta <- theta + alpha g (SGD, or Adam / weight decay).
``perturbation: lowrank`` draws eps_i = A_i B_i^T / sqrt(rank) on every weight matrix instead
(``esbox.lowrank``): the same estimate, members evaluated in one batched forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from esbox.config import option
from esbox.errors import ConfigError
from esbox.lowrank import LowRankOptions
from esbox.registry import register
from esbox.specs import Perturbation, Term
from esbox.strategy import Strategy, StrategyOptions, gradient_terms, nearest_multiples


@register("openai_es")
class OpenAIES(Strategy):
    """Isotropic Gaussian ES with the canonical gradient estimate sum r_i eps_i / (N sigma)."""

    description = "OpenAI-ES: antithetic Gaussian search, canonical gradient estimate"

    @dataclass
    class Options(LowRankOptions, StrategyOptions):
        antithetic: bool = option(True, "evaluate +eps and -eps pairs (needs an even group size)")

    @classmethod
    def population_multiple(cls, options: dict) -> int:
        return 2 if options.get("antithetic", True) is not False else 1

    def _validate(self) -> None:
        if self.options.antithetic and self.options.population % 2:
            n = self.options.population
            raise ConfigError(
                f"population must be even with antithetic sampling, got {n}; nearest valid "
                f"populations: {nearest_multiples(n, 2)} (or set antithetic=false)"
            )

    def group(
        self, size: int, scale: float, subspace: int = 0, num_subspaces: int = 1
    ) -> list[Perturbation]:
        """``size`` members of one subspace: antithetic pairs (+, -) or independent seeds."""
        if self.options.antithetic:
            seeds = self.draw_seeds(size // 2)
            return [
                self.member(s, sign * scale, subspace, num_subspaces)
                for s in seeds
                for sign in (1.0, -1.0)
            ]
        return [self.member(s, scale, subspace, num_subspaces) for s in self.draw_seeds(size)]

    def _ask(self, sigma: float) -> list[Perturbation]:
        return self.group(self.options.population, sigma)

    def _terms(self, perturbations: Sequence[Perturbation], shaped: np.ndarray) -> list[Term]:
        return gradient_terms(perturbations, shaped)
