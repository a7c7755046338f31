"""Rollouts of a whole low-rank population in shared batched forwards (EGGROLL-style).

All N members x B prompts of a step go to the transformers backend as N member-major groups
of rows, in as few ``generate`` calls as ``max_rows`` allows; member i's noise is added inside
the linear and embedding layers by ``LowRankPopulation``, so no weight is written during the
step. Greedy decoding keeps the common random numbers: every member sees the same prompts and
its completion does not depend on the other rows. Full-rank populations, other backends and
other spaces fall back to ``RolloutEvaluator``'s sweep (one member at a time, weights written).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from esbox.adapters.generation.hf import HFBackend
from esbox.adapters.models.batched import LowRankPopulation
from esbox.adapters.models.space import TorchModuleSpace
from esbox.space import ParameterSpace
from esbox.specs import Perturbation

from .rollouts import RolloutEvaluator


class BatchedRolloutEvaluator(RolloutEvaluator):
    """``RolloutEvaluator`` that scores low-rank populations in batched forwards.

    ``max_rows`` caps the rows of one ``generate`` call (0: all ``N x batch_size`` at once);
    a call holds whole groups of prompts, at least one prompt per member, so at least N rows.
    """

    def __init__(self, *args: Any, max_rows: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if max_rows < 0:
            raise ValueError(f"max_rows must be >= 0, got {max_rows}")
        self.max_rows = max_rows

    def batches(self, space: ParameterSpace, perturbations: Sequence[Perturbation]) -> bool:
        """True when this population is evaluated in batched forwards (else by the sweep)."""
        return (
            bool(perturbations)
            and all(p.rank > 0 for p in perturbations)
            and isinstance(space, TorchModuleSpace)
            and isinstance(self.backend, HFBackend)
        )

    def prompts_per_call(self, size: int, prompts: int) -> int:
        """Prompts of each member in one batched call: ``max_rows`` over the population, at
        least one; all ``prompts`` when ``max_rows`` is 0."""
        return max(1, self.max_rows // size) if self.max_rows else prompts

    def evaluate(self, space: ParameterSpace, perturbations: Sequence[Perturbation]) -> np.ndarray:
        if not self.batches(space, perturbations):
            return super().evaluate(space, perturbations)
        assert isinstance(space, TorchModuleSpace)
        step, size = perturbations[0].step, len(perturbations)
        batch = self.task.sample_batch(step, self.batch_size, self.seed)
        per_call = self.prompts_per_call(size, len(batch))
        rewards = np.empty((size, len(batch)))
        with LowRankPopulation(space, perturbations):
            for lo in range(0, len(batch), per_call):
                part = batch[lo : lo + per_call]
                completions = self.backend.generate(
                    [q for p in perturbations for q in self._prompts(part, p.context)],
                    prefills=[e.prefill for _ in perturbations for e in part],
                    max_new_tokens=self.max_new_tokens,
                    greedy=self.greedy,
                    seed=None if self.greedy else self.seed * 1_000_003 + step,
                    stop=list(self.task.stop) or None,
                    groups=size,
                )
                for i in range(size):
                    row = completions[i * len(part) : (i + 1) * len(part)]
                    rewards[i, lo : lo + len(part)] = [
                        self._reward(c, e) for c, e in zip(row, part, strict=True)
                    ]
        return rewards.mean(axis=1)
