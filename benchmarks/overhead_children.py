"""Overhead measurements of the peers, one per subprocess: seconds of ask + tell per
generation and peak extra RSS at population N and dimension d.

The esbox rows are the core suite's own ``loop`` child (:mod:`benchmarks.core_children`),
which times ask, perturb, evaluate, restore, tell and apply separately; here a peer's
generation is its ``step`` with a near-free objective (the first coordinate of each
candidate), whose time is subtracted. The first two generations (JIT compilation and one
retrace for evosax) are reported apart; the steady-state time is the median of the later ones.
"""

from __future__ import annotations

import importlib
import statistics
import time
from typing import Any

import numpy as np

from benchmarks import measure
from benchmarks.peers import PEERS

WARMUP = 2  # generations before timing: evosax compiles ask/tell, then retraces once


def child_peer(
    peer: str, d: int, population: int, generations: int, min_seconds: float
) -> dict[str, Any]:
    """Run ``peer`` at (N, d): WARMUP generations, then up to ``generations`` timed ones (at
    least one, more while under ``min_seconds``); median seconds without the objective, and
    the peak RSS above the RSS after importing the library and drawing x0."""
    importlib.import_module(PEERS[peer].library)  # imports are start-up, not overhead
    x0 = np.random.default_rng(0).uniform(-4.0, 4.0, d)
    baseline = measure.settle()
    reset = measure.reset_peak()
    spent = [0.0]

    def objective(batch: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        values = np.asarray(batch[:, 0], dtype=np.float64)
        spent[0] += time.perf_counter() - start
        return values

    searcher = PEERS[peer].build(x0, 0, 10**12, population)
    times: list[float] = []
    total = measure.stopwatch()
    while len(times) < WARMUP + generations and (len(times) < WARMUP + 1 or total() < min_seconds):
        spent[0] = 0.0
        start = time.perf_counter()
        searcher.step(objective)
        times.append(time.perf_counter() - start - spent[0])
    return {
        "baseline": baseline,
        "peak": measure.peak_mib(),
        "peak_reset": reset,
        "first": sum(times[:WARMUP]),
        "seconds": statistics.median(times[WARMUP:]),
        "generations": len(times) - WARMUP,
    }


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """One peer measurement with one thread in every numeric library."""
    from benchmarks.quality_runs import init_worker

    init_worker()
    spec = dict(spec)
    spec.pop("kind", None)
    return child_peer(**spec)


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(serve))
