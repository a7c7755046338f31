"""CoPES: Cooperative Parameter-subspace ES (resource-constrained agentic LLM post-training).

Each step: a random K-way partition of the parameters; N/K members per subspace perturb only
their subspace with sigma_k = sqrt(K) sigma; all N rewards are standardized jointly; one
synchronous update theta <- theta + alpha sum_k P_k g_k with
g_k = sum_i r_ki P_k eps_ki / (N_k sigma_k). K = 1 is exactly OpenAI-ES.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esbox.config import option
from esbox.errors import ConfigError, ConfigWarning
from esbox.registry import register
from esbox.shaping import SHAPINGS, shape
from esbox.specs import Perturbation
from esbox.strategies.openai_es import OpenAIES
from esbox.strategy import nearest_multiples


@register("copes")
class CoPES(OpenAIES):
    """OpenAI-ES over K random disjoint subspaces per step, with joint reward standardization."""

    description = "CoPES: K random subspaces per step, sigma_k = sqrt(K) sigma, joint z-scores"

    @dataclass
    class Options(OpenAIES.Options):
        shaping: str = option("zscore", "reward shaping", choices=SHAPINGS)
        subspaces: int = option(4, "K: random disjoint subspaces per step", minimum=1)
        standardization: str = option(
            "joint",
            "shape all N rewards together or per subspace",
            choices=("joint", "per_subspace"),
        )
        scale_sigma: bool = option(True, "use sigma_k = sqrt(K) sigma (dimension-aware scale)")
        partition: bool = option(True, "false: standard ES on all coordinates (ablation)")

    @classmethod
    def vector_defaults(cls, dimension: int) -> dict[str, Any]:
        """No more subspaces than coordinates: a d < K vector gets K = d."""
        default = cls.Options.__dataclass_fields__["subspaces"].default
        return {"subspaces": dimension} if dimension < default else {}

    @classmethod
    def population_multiple(cls, options: dict) -> int:
        k = options.get("subspaces", 4)
        if options.get("partition", True) is False or isinstance(k, bool) or not isinstance(k, int):
            return super().population_multiple(options)
        return max(k, 1) * super().population_multiple(options)

    def _validate(self) -> None:
        n, k = self.options.population, self.options.subspaces
        antithetic = self.options.antithetic
        valid = f"nearest valid populations: {nearest_multiples(n, 2 * k if antithetic else k)}"
        if n % k:
            raise ConfigError(
                f"population ({n}) must be divisible by subspaces ({k}); {valid}"
                + (f" (a multiple of 2 x {k} with antithetic pairs)" if antithetic else "")
            )
        if antithetic and (n // k) % 2:
            raise ConfigError(
                f"antithetic sampling needs an even number of members per "
                f"subspace; population/subspaces = {n // k}; {valid} "
                f"(or set antithetic=false)"
            )
        if k > self.dimension and self.options.partition:
            warnings.warn(
                f"copes option subspaces ({k}) exceeds the dimension ({self.dimension}): "
                f"{k - self.dimension} subspaces are empty at every step and their members "
                f"evaluate the unperturbed point; use subspaces <= {self.dimension}",
                ConfigWarning,
                stacklevel=4,
            )

    def _ask(self, sigma: float) -> list[Perturbation]:
        k = self.options.subspaces
        sigma_k = math.sqrt(k) * sigma if self.options.scale_sigma else sigma
        if not self.options.partition:
            return self.group(self.options.population, sigma_k)
        size = self.options.population // k
        return [p for s in range(k) for p in self.group(size, sigma_k, s, k)]

    def _shape(self, rewards: np.ndarray, perturbations: Sequence[Perturbation]) -> np.ndarray:
        if self.options.standardization == "per_subspace":
            groups = np.array([p.subspace for p in perturbations])
            return shape(rewards, self.options.shaping, groups)
        return shape(rewards, self.options.shaping)
