"""Agentic ESOpt: online reward-weighted ES with a cosine decay of sigma, and prompt co-evolution.

Each step samples perturbations around the current parameters, scores them, and applies the
online reward-weighted update theta <- theta + alpha / N sum_i z_i eps_i (z: standardized
rewards; note no 1/sigma: alpha here equals the canonical learning rate times sigma_t).
sigma follows sigma_t = sigma_min + (sigma_0 - sigma_min)(1 + cos(pi t / T)) / 2.
With ``contexts`` (e.g. skill texts), members are spread round-robin over a context population
evaluated jointly with the parameter perturbations; rewards are standardized within each
context for the parameter update, and each context keeps an online score of its mean reward.
``perturbation: lowrank`` draws eps_i = A_i B_i^T / sqrt(rank) on every weight matrix
(``esbox.lowrank``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esbox.config import option
from esbox.errors import ConfigError
from esbox.lowrank import LowRankOptions
from esbox.registry import register
from esbox.schedules import Cosine, ScheduleLike
from esbox.shaping import SHAPINGS, shape
from esbox.specs import Perturbation, Term, Update
from esbox.strategy import SIGMA_FORM, Strategy, StrategyOptions, gradient_terms

ContextProposer = Callable[[str, Sequence[str], Sequence[float]], str]


@register("esopt")
class ESOpt(Strategy):
    """Reward-weighted online ES with cosine sigma decay and optional context co-evolution."""

    description = "Agentic ESOpt: reward-weighted update, cosine sigma decay, context co-evolution"
    adaptive_rate_power = 1  # no 1/sigma in the update: lr follows sigma_t / sigma_0

    @dataclass
    class Options(LowRankOptions, StrategyOptions):
        sigma: ScheduleLike = option(
            0.02,
            "sigma_0 (a number gets the cosine decay), a schedule or adaptive",
            form=SIGMA_FORM,
        )
        shaping: str = option("zscore", "reward shaping", choices=SHAPINGS)
        decay_steps: int = option(100, "T of the cosine sigma decay", minimum=1)
        sigma_min_ratio: float = option(0.1, "sigma_min / sigma_0 of the cosine decay", minimum=0.0)
        contexts: list = option([], "context population (e.g. skill texts) to co-evolve")
        context_momentum: float = option(
            0.5, "weight of the past in a context's online score", minimum=0.0
        )
        evolve_every: int = option(
            1, "steps between context replacements (with a proposer)", minimum=1
        )

    def __init__(
        self,
        dimension: int,
        *,
        seed: int = 0,
        context_proposer: ContextProposer | None = None,
        **options: Any,
    ) -> None:
        super().__init__(dimension, seed=seed, **options)
        if isinstance(self.options.sigma, (int, float)):
            start = float(self.options.sigma)
            self.sigma = Cosine(
                start, start * self.options.sigma_min_ratio, self.options.decay_steps
            )
        self.contexts: list[str] = [str(c) for c in self.options.contexts]
        self.context_scores = [float("nan")] * len(self.contexts)
        self.context_proposer = context_proposer

    def _validate(self) -> None:
        n_ctx, population = len(self.options.contexts), self.options.population
        if n_ctx > population:
            raise ConfigError(
                f"esopt option population ({population}) must be at least the number of "
                f"contexts ({n_ctx}), so that every context is evaluated at every step"
            )

    @property
    def best_context_index(self) -> int | None:
        """Index of the context with the highest online score (the first one before any step)."""
        if not self.contexts:
            return None
        return int(np.argmax(np.nan_to_num(np.array(self.context_scores), nan=-np.inf)))

    @property
    def best_context(self) -> str | None:
        """The context with the highest online score (the first one before any step)."""
        best = self.best_context_index
        return None if best is None else self.contexts[best]

    def tell(self, rewards: Sequence[float] | np.ndarray) -> Update:
        """As ``Strategy.tell``; with contexts, the metrics also name the best context."""
        update = super().tell(rewards)
        best = self.best_context_index
        if best is not None:
            self.metrics.update(
                context_best=best,
                context_best_score=self.context_scores[best],
                context_best_chars=len(self.contexts[best]),
            )
        return update

    def _ask(self, sigma: float) -> list[Perturbation]:
        n_ctx = len(self.contexts)
        return [
            self.member(s, sigma, context=(i % n_ctx) if n_ctx else None)
            for i, s in enumerate(self.draw_seeds(self.options.population))
        ]

    def _shape(self, rewards: np.ndarray, perturbations: Sequence[Perturbation]) -> np.ndarray:
        if not self.contexts:
            return shape(rewards, self.options.shaping)
        groups = np.array([p.context for p in perturbations])
        self._score_contexts(rewards, groups)
        return shape(rewards, self.options.shaping, groups)

    def _score_contexts(self, rewards: np.ndarray, groups: np.ndarray) -> None:
        beta = self.options.context_momentum
        for c in np.unique(groups):
            mean = float(rewards[groups == c].mean())
            old = self.context_scores[c]
            self.context_scores[c] = mean if np.isnan(old) else beta * old + (1 - beta) * mean
        if self.context_proposer and (self.step + 1) % self.options.evolve_every == 0:
            # the last of the lowest scores: with ties (or all equal) the best one is kept
            scores = np.nan_to_num(self.context_scores, nan=np.inf)
            worst = len(scores) - 1 - int(np.argmin(scores[::-1]))
            proposal = self.context_proposer(
                self.best_context or "", self.contexts, self.context_scores
            )
            self.contexts[worst], self.context_scores[worst] = str(proposal), float("nan")

    def _terms(self, perturbations: Sequence[Perturbation], shaped: np.ndarray) -> list[Term]:
        return gradient_terms(perturbations, shaped, scale_by_sigma=False)

    def _extra_state(self) -> dict[str, Any]:
        return {"contexts": self.contexts, "context_scores": self.context_scores}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.contexts = list(state["contexts"])
        self.context_scores = [float(s) for s in state["context_scores"]]
