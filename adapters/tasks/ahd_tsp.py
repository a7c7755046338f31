"""AHD TSP construction: the model writes ``next_city(current, unvisited, distances)``.

Instances are ``n_cities`` points drawn uniformly in the unit square; a tour starts at city 0
and the function picks each next city. An instance's cost is the closed tour's Euclidean
length; the reward is ``(reference length - length) / reference length`` over the example's
instances, in [0, 1], against nearest neighbour (see :mod:`.ahd`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .ahd import AHDTask
from .checks import check_int

SIGNATURE = '''Travelling salesman tour construction: a tour of n cities in the unit square starts
at city 0 and is built one city at a time, then returns to city 0. Write the Python function

def next_city(current: int, unvisited: list[int], distances: list[list[float]]) -> int:
    """Choose the next city of the tour: one of `unvisited` (city indices).

    `current` is the city the tour is at; `distances[i][j]` is the Euclidean distance between
    cities i and j. The goal is the shortest closed tour.
    """'''

REFERENCE = '''def next_city(current, unvisited, distances):
    """Nearest neighbour: the closest unvisited city."""
    return min(unvisited, key=lambda city: distances[current][city])
'''


def nearest_neighbour(current: int, unvisited: list[int], distances: list[list[float]]) -> int:
    """The reference heuristic (the same rule as :data:`REFERENCE`)."""
    return min(unvisited, key=lambda city: distances[current][city])


class TSPTask(AHDTask):
    """Seeded uniform Euclidean instances of ``n_cities`` cities; the reference is nearest
    neighbour."""

    problem = "tsp"
    function = "next_city"
    reference_name = "nearest neighbour"
    signature = SIGNATURE
    reference_code = REFERENCE
    reference = staticmethod(nearest_neighbour)

    def __init__(self, *, n_cities: int = 30, name: str = "ahd_tsp", **options: Any) -> None:
        self.n_cities = check_int("n_cities", n_cities, 3)
        self.name = name
        super().__init__(**options)

    def _instance(self, rng: np.random.Generator) -> dict[str, Any]:
        points = rng.random((self.n_cities, 2))
        return {"points": [[float(x), float(y)] for x, y in points]}

    def _cost(self, instance: dict[str, Any], solution: Any) -> float | None:
        """The closed tour's length if ``solution`` visits every city once, else None."""
        points = instance["points"]
        if not isinstance(solution, list) or not all(
            isinstance(city, int) and not isinstance(city, bool) for city in solution
        ):
            return None
        if sorted(solution) != list(range(len(points))):
            return None
        legs = zip(solution, solution[1:] + solution[:1], strict=True)
        return math.fsum(math.dist(points[a], points[b]) for a, b in legs)
