"""The base of strategies whose steps another optimizer makes (pycma, nevergrad): it is told
the losses of each step and moves the parameters itself, so the update is an explicit shift."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from esbox.specs import Perturbation, Term, Update
from esbox.strategy import Strategy


class ToldStrategy(Strategy):
    """``raw`` shaping keeps the rewards' values (the optimizer needs them, even alone or
    tied); a step tells :meth:`_tell_losses` the negated shaped rewards (+inf for a step without
    a finite reward, which has no worst finite one to stand for it), which sets ``_move``; the
    update shifts the parameters by it and has no terms."""

    def _init_told(self, dimension: int) -> None:
        self._move = np.zeros(dimension)  # the last step's shift
        self._rewards: Sequence[float] | np.ndarray = ()  # of the tell under way

    @abstractmethod
    def _tell_losses(self, losses: Sequence[float]) -> None:
        """Tell the optimizer one step's losses; set ``_move`` to the step's shift."""

    def _shape(self, rewards: np.ndarray, perturbations: Sequence[Perturbation]) -> np.ndarray:
        if self.options.shaping == "raw":
            return np.asarray(rewards, dtype=np.float64)
        return super()._shape(rewards, perturbations)

    def _terms(self, perturbations: Sequence[Perturbation], shaped: np.ndarray) -> list[Term]:
        if np.isfinite(np.asarray(self._rewards, dtype=np.float64)).any():
            self._tell_losses([-float(r) for r in shaped])
        else:
            self._tell_losses([math.inf] * len(shaped))
        return []

    def tell(self, rewards: Sequence[float] | np.ndarray) -> Update:
        """As ``Strategy.tell``; the update moves the parameters by the optimizer's step."""
        self._rewards = rewards
        update = super().tell(rewards)
        return replace(update, shift=tuple(self._move.tolist()))
