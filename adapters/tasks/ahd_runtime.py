"""What runs a heuristic on AHD instances: online bin packing and tour construction.

Standard library only: the sandboxed program that scores model-written code is this module's
source, the code, and a call of :func:`main`; the host runs the same functions on the reference
heuristic, so the reference and the model's code are scored by one implementation.
"""

import json
import math
import sys

MARKER = "@@ahd-result@@ "


class HeuristicError(Exception):
    """The heuristic broke the contract: the wrong type, length or choice."""


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HeuristicError(f"a score must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise HeuristicError(f"a score must be finite, got {value!r}")
    return float(value)


def pack_online(items, capacity, priority):
    """Pack ``items`` in order; each goes where ``priority`` scores highest.

    The candidates are the remaining capacities of the open bins the item fits, then one empty
    bin (``capacity``); the first best score wins, and choosing the empty bin opens it. Returns
    the bin index of every item.
    """
    remaining, assignment = [], []
    for item in items:
        fits = [i for i, r in enumerate(remaining) if r >= item]
        candidates = [float(remaining[i]) for i in fits] + [float(capacity)]
        scores = priority(float(item), list(candidates))
        if not isinstance(scores, (list, tuple)) or len(scores) != len(candidates):
            got = len(scores) if isinstance(scores, (list, tuple)) else type(scores).__name__
            raise HeuristicError(f"priority must return {len(candidates)} scores, got {got}")
        scores = [_number(s) for s in scores]
        best = scores.index(max(scores))
        if best == len(fits):
            remaining.append(capacity)
            chosen = len(remaining) - 1
        else:
            chosen = fits[best]
        remaining[chosen] -= item
        assignment.append(chosen)
    return assignment


def build_tour(distances, next_city):
    """A tour from city 0: ``next_city(current, unvisited, distances)`` picks each next city."""
    n = len(distances)
    tour, unvisited = [0], list(range(1, n))
    while unvisited:
        city = next_city(tour[-1], list(unvisited), [list(row) for row in distances])
        if isinstance(city, bool) or not isinstance(city, int) or city not in unvisited:
            raise HeuristicError(f"next_city must return an unvisited city index, got {city!r}")
        unvisited.remove(city)
        tour.append(city)
    return tour


def distance_matrix(points):
    """Euclidean distances between ``points`` (pairs of floats)."""
    return [[math.dist(p, q) for q in points] for p in points]


def solve(kind, heuristic, instance):
    """The solution ``heuristic`` builds for one instance of ``kind``."""
    if kind == "binpacking":
        return pack_online(instance["items"], instance["capacity"], heuristic)
    return build_tour(distance_matrix(instance["points"]), heuristic)


def main(kind, code, name):
    """Sandbox entry: instances on stdin, one marker line of solutions on stdout."""
    instances = json.loads(sys.stdin.read())
    namespace = {"__name__": "heuristic"}
    exec(compile(code, "<heuristic>", "exec"), namespace)
    heuristic = namespace.get(name)
    if not callable(heuristic):
        raise HeuristicError(f"the code defines no function {name}")
    solutions = [solve(kind, heuristic, instance) for instance in instances]
    sys.stdout.write("\n" + MARKER + json.dumps(solutions) + "\n")
