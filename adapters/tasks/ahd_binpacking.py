"""AHD online bin packing (FunSearch's setting): the model writes ``priority(item, bins)``.

Items arrive one at a time and are packed at once. Item sizes are Weibull(``shape``,
``scale``) draws rounded to integers and clipped to [1, ``capacity``], as in FunSearch's Weibull
sets (shape 3, scale 45, capacity 100). An instance's cost is its excess bins: the bins used
minus the L1 lower bound ``ceil(sum(items) / capacity)``; the reward is the fraction of the
reference's (best fit's) excess bins removed, in [0, 1] (see :mod:`.ahd`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from .ahd import AHDTask
from .checks import check_int, check_positive

SIGNATURE = '''Online bin packing: items arrive one at a time and each must be packed at once into
a bin of capacity {capacity}. Write the Python function

def priority(item: float, bins: list[float]) -> list[float]:
    """Score each candidate bin for `item`; the item goes to the bin with the highest score.

    `bins` holds the remaining capacities of the open bins the item fits in, then one empty
    bin (remaining capacity {capacity}); choosing the empty bin opens a new bin. Return one
    number per entry of `bins`. The goal is to use as few bins as possible.
    """'''

REFERENCE = '''def priority(item: float, bins: list[float]) -> list[float]:
    """Best fit: the bin left with the least room wins."""
    return [-(room - item) for room in bins]
'''


def best_fit(item: float, bins: list[float]) -> list[float]:
    """The reference heuristic (the same rule as :data:`REFERENCE`)."""
    return [-(room - item) for room in bins]


class BinPackingTask(AHDTask):
    """Seeded Weibull instances of ``n_items`` items; the reference is best fit."""

    problem = "binpacking"
    function = "priority"
    reference_name = "best fit"
    reference_code = REFERENCE
    reference = staticmethod(best_fit)

    def __init__(
        self,
        *,
        n_items: int = 100,
        capacity: int = 100,
        shape: float = 3.0,
        scale: float = 45.0,
        name: str = "ahd_binpacking",
        **options: Any,
    ) -> None:
        self.n_items = check_int("n_items", n_items, 1)
        self.capacity = check_int("capacity", capacity, 1)
        self.shape = check_positive("shape", shape)
        self.scale = check_positive("scale", scale)
        self.signature = SIGNATURE.format(capacity=capacity)
        self.name = name
        super().__init__(**options)

    def _instance(self, rng: np.random.Generator) -> dict[str, Any]:
        sizes = np.rint(rng.weibull(self.shape, self.n_items) * self.scale)
        items = np.clip(sizes, 1, self.capacity).astype(int)
        return {"items": [int(x) for x in items], "capacity": self.capacity}

    def _cost(self, instance: dict[str, Any], solution: Any) -> float | None:
        """Excess bins of a valid packing (every item in a bin, no bin over capacity), else None."""
        items, capacity = instance["items"], instance["capacity"]
        if not isinstance(solution, list) or len(solution) != len(items):
            return None
        loads: defaultdict[int, int] = defaultdict(int)
        for item, index in zip(items, solution, strict=True):
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                return None
            loads[index] += item
        if any(load > capacity for load in loads.values()):
            return None
        return float(len(loads) - math.ceil(sum(items) / capacity))
