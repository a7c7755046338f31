"""Core benchmark measurements, one per subprocess: ``esbox.optimize``'s peak RSS, a timed
ask/tell loop, and a naive explicit-noise OpenAI-ES (what seed replay avoids).

The parent (:mod:`benchmarks.core`) runs ``python -m benchmarks.core_children --child '<json>'``
through :func:`benchmarks.measure.run_child`; the spec names the child (``kind``), the torch
threads and the child's arguments.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import measure

SIGMA = 0.01
LEARNING_RATE = 0.01
SUBSPACES = 4
EVAL_BLOCK = 1 << 20
PHASES = ("ask", "perturb", "evaluate", "restore", "tell", "apply")


# -- the objective ------------------------------------------------------------------------------
def make_rastrigin(kind: str) -> Callable[[np.ndarray], float]:
    """Rastrigin (to minimize): the library's numpy kernel, or the same sum in 2^20 blocks.

    The blocked form gives the same value (checked against the library at start-up) with
    bounded temporaries and ~20x less time at d = 10^7, so the benchmark measures esbox and
    not the objective's scratch arrays.
    """
    from esbox.adapters.functions import get_function

    reference = get_function("rastrigin")
    if kind == "numpy":
        return reference

    import torch

    def rastrigin(x: np.ndarray) -> float:
        t = torch.from_numpy(np.ascontiguousarray(x))
        total = 10.0 * t.numel()
        for lo in range(0, t.numel(), EVAL_BLOCK):
            z = t[lo : lo + EVAL_BLOCK].to(torch.float64)
            total += float(z.square().sum()) - 10.0 * float(torch.cos(z * (2 * math.pi)).sum())
        return total

    probe = np.random.default_rng(1).uniform(-5.12, 5.12, 3 * EVAL_BLOCK // 2 + 7)
    expected, got = reference(probe), rastrigin(probe)
    if abs(got - expected) > 1e-9 * abs(expected):
        raise AssertionError(f"blocked rastrigin {got} differs from the library's {expected}")
    return rastrigin


def start_point(d: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-5.12, 5.12, d)


def strategy_options(strategy: str, population: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "population": population,
        "sigma": SIGMA,
        "learning_rate": LEARNING_RATE,
    }
    if strategy == "copes":
        options["subspaces"] = SUBSPACES
    return options


# -- child measurements (one per subprocess) ------------------------------------------------------
def child_optimize(d: int, population: int, steps: int, function: str) -> dict[str, Any]:
    """Peak RSS of ``esbox.optimize`` with copes; peak recorded after every step."""
    import esbox

    f = make_rastrigin(function)
    x0 = start_point(d)
    baseline = measure.settle()
    reset = measure.reset_peak()
    per_step: list[float] = []

    def record_peak(runner: Any, metrics: dict[str, Any]) -> None:
        per_step.append(measure.peak_mib())

    start = time.perf_counter()
    result = esbox.optimize(
        f,
        x0,
        strategy="copes",
        max_steps=steps,
        seed=0,
        callbacks=[record_peak],
        **strategy_options("copes", population),
    )
    seconds = time.perf_counter() - start
    return {
        "baseline": baseline,
        "peak": measure.peak_mib(),
        "per_step_peak": per_step,
        "peak_reset": reset,
        "seconds_per_step": seconds / max(result.steps, 1),
        "steps": result.steps,
    }


def child_loop(d: int, population: int, steps: int, strategy: str, function: str) -> dict[str, Any]:
    """An ask/tell loop by hand, timing each phase; also reports the peak RSS."""
    import esbox

    f = make_rastrigin(function)
    x0 = start_point(d)
    baseline = measure.settle()
    reset = measure.reset_peak()
    clock = time.perf_counter
    totals = dict.fromkeys(PHASES, 0.0)
    space = esbox.VectorSpace(x0)
    es = esbox.make_strategy(strategy, space, seed=0, **strategy_options(strategy, population))
    for _ in range(steps):
        t0 = clock()
        perturbations = es.ask()
        totals["ask"] += clock() - t0
        rewards = []
        for p in perturbations:
            t0 = clock()
            context = space.perturbed(p)
            context.__enter__()
            t1 = clock()
            try:
                rewards.append(-f(space.vector))
            finally:
                t2 = clock()
                context.__exit__(None, None, None)
                t3 = clock()
            totals["perturb"] += t1 - t0
            totals["evaluate"] += t2 - t1
            totals["restore"] += t3 - t2
        t0 = clock()
        update = es.tell(rewards)
        t1 = clock()
        space.apply(update)
        totals["tell"] += t1 - t0
        totals["apply"] += clock() - t1
    return {
        "baseline": baseline,
        "peak": measure.peak_mib(),
        "peak_reset": reset,
        "phases": {k: v / steps for k, v in totals.items()},
    }


def child_naive(d: int, population: int, steps: int, function: str) -> dict[str, Any]:
    """OpenAI-ES with an explicit N x d float32 noise matrix (what seed replay avoids)."""
    f = make_rastrigin(function)
    x0 = start_point(d)
    baseline = measure.settle()
    reset = measure.reset_peak()
    clock = time.perf_counter
    totals = dict.fromkeys(PHASES, 0.0)
    rng = np.random.default_rng(0)
    theta = x0.copy()
    for _ in range(steps):
        t0 = clock()
        eps = rng.standard_normal((population, d), dtype=np.float32)
        totals["ask"] += clock() - t0
        rewards = np.empty(population)
        for i in range(population):
            t0 = clock()
            x = theta + SIGMA * eps[i]
            t1 = clock()
            rewards[i] = -f(x)
            totals["perturb"] += t1 - t0
            totals["evaluate"] += clock() - t1
            del x
        t0 = clock()
        std = rewards.std()
        shaped = (rewards - rewards.mean()) / std if std > 0 else np.zeros(population)
        t1 = clock()
        gradient = shaped.astype(np.float32) @ eps / (population * SIGMA)
        theta += LEARNING_RATE * gradient
        totals["tell"] += t1 - t0
        totals["apply"] += clock() - t1
        del eps, gradient
    return {
        "baseline": baseline,
        "peak": measure.peak_mib(),
        "peak_reset": reset,
        "phases": {k: v / steps for k, v in totals.items()},
    }


CHILDREN = {"optimize": child_optimize, "loop": child_loop, "naive": child_naive}


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the child ``spec["kind"]`` with ``spec["threads"]`` torch threads."""
    import torch

    spec = dict(spec)
    torch.set_num_threads(spec.pop("threads"))
    return CHILDREN[spec.pop("kind")](**spec)


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(serve))
