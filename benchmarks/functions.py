"""The test problems of the quality and copes suites, and how one run is scored.

The functions come from esbox's own catalog (``esbox.adapters.functions``); bent cigar, which
the catalog lacks, is built here on the catalog's ``BenchmarkFunction``. A :class:`Tracker`
wraps a function, counts evaluations (one point or a batch), stops counting at the budget,
and records when the best value first reached each target; :func:`ert` turns such records
into COCO's expected running time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from esbox.adapters.functions import BenchmarkFunction, get_function

START_HALF_WIDTH = 4.0  # x0 ~ U[-4, 4]^d, COCO's initial region; the optimum lies inside it
TARGETS = (1e-1, 1e-3, 1e-6)  # precision targets, as fractions of f(x0) - f_opt
BENT_CIGAR_CONDITION = 1e6


def _bent_cigar(z: np.ndarray, condition: float) -> np.ndarray:
    """z_1^2 + condition * sum_{i>1} z_i^2: one long axis in a steep valley (COCO f12,
    unrotated)."""
    return z[:, 0] ** 2 + condition * np.sum(z[:, 1:] ** 2, axis=1)


BENT_CIGAR = BenchmarkFunction(
    "bent_cigar",
    _bent_cigar,
    (-5.0, 5.0),
    min_dimension=2,
    params={"condition": BENT_CIGAR_CONDITION},
)

# suite name -> (catalog name or a function built here, label in tables)
PROBLEMS: dict[str, str] = {
    "sphere": "sphere",
    "ellipsoid": "ellipsoid (separable, cond. 1e6)",
    "rotated_ellipsoid": "ellipsoid (rotated, cond. 1e6)",
    "rosenbrock": "Rosenbrock",
    "rastrigin": "Rastrigin",
    "ackley": "Ackley",
    "bent_cigar": "bent cigar (cond. 1e6)",
}


def problem(name: str) -> BenchmarkFunction:
    """The function ``name`` of :data:`PROBLEMS`: from the catalog, or bent cigar."""
    if name not in PROBLEMS:
        raise ValueError(f"unknown problem {name!r}; known: {', '.join(PROBLEMS)}")
    return BENT_CIGAR if name == "bent_cigar" else get_function(name)


def start_point(d: int, seed: int) -> np.ndarray:
    """The run's x0: uniform in [-4, 4]^d from the seed (every method of a seed starts here)."""
    return np.random.default_rng(seed).uniform(-START_HALF_WIDTH, START_HALF_WIDTH, d)


class BudgetSpent(Exception):
    """Raised by a Tracker asked to evaluate past its budget (ends a peer's loop)."""


@dataclass
class Tracker:
    """Counts evaluations of ``fn`` up to ``budget`` and records the best value and the
    evaluation at which it first reached each target (absolute values)."""

    fn: BenchmarkFunction
    budget: int
    targets: Sequence[float]
    evaluations: int = 0
    best: float = math.inf
    hits: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hits = [None] * len(self.targets)

    def __call__(self, x: np.ndarray) -> float | np.ndarray:
        """One point (d,) to a float, or a batch (n, d) to (n,); raises BudgetSpent when the
        budget is already spent; evaluations past it in a batch are not counted."""
        if self.evaluations >= self.budget:
            raise BudgetSpent
        values = np.atleast_1d(np.asarray(self.fn(x), dtype=np.float64))
        for value in values[: self.budget - self.evaluations]:
            self.evaluations += 1
            if value < self.best:
                self.best = float(value)
                for i, target in enumerate(self.targets):
                    if self.hits[i] is None and value <= target:
                        self.hits[i] = self.evaluations
        return float(values[0]) if np.ndim(x) == 1 else values

    @property
    def spent(self) -> bool:
        return self.evaluations >= self.budget


def targets_for(
    fn: BenchmarkFunction, x0: np.ndarray, fractions: Sequence[float] = TARGETS
) -> tuple[float, list[float]]:
    """f(x0) and the absolute targets f_opt + fraction * (f(x0) - f_opt)."""
    f0, f_opt = float(fn(x0)), fn.optimum_value(x0.size)
    return f0, [f_opt + t * (f0 - f_opt) for t in fractions]


def ert(hits: Sequence[int | None], evaluations: Sequence[int]) -> tuple[float, float]:
    """COCO's expected running time to a target and the success rate, over runs.

    ERT = (evaluations of the successful runs up to their hit + all evaluations of the
    unsuccessful ones) / number of successes; inf when no run succeeded.
    """
    spent = sum(h if h is not None else e for h, e in zip(hits, evaluations, strict=True))
    successes = sum(h is not None for h in hits)
    return (spent / successes if successes else math.inf), successes / max(len(hits), 1)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """Median, first and third quartile."""
    q1, median, q3 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return float(median), float(q1), float(q3)


def standard_error(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error (0 for a single value)."""
    array = np.asarray(values, dtype=np.float64)
    se = float(array.std(ddof=1) / math.sqrt(array.size)) if array.size > 1 else 0.0
    return float(array.mean()), se


def fmt(value: float) -> str:
    """A value in a table: 3 significant digits, ``inf`` or ``-``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}"
