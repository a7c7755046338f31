"""One optimization run of the quality and copes suites, in a worker process.

:func:`run` takes a plain dict (picklable, so a spawn pool can carry it) naming the method
(``esbox:<strategy>`` with optional strategy options, or a peer of :mod:`benchmarks.peers`),
the problem, the dimension, the seed and the budget in evaluations, and returns what the
tracker saw. esbox runs are ``esbox.optimize(f, x0, strategy=name, budget=B, seed=s)`` with
the strategy's default options unless the spec gives some (the copes ablations).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from benchmarks import functions, measure
from benchmarks.peers import PEERS, Finished

ESBOX = "esbox:"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def init_worker() -> None:
    """One thread for every numeric library in this process (set before any of them runs)."""
    for name in THREAD_VARIABLES:
        os.environ[name] = "1"
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import torch

    torch.set_num_threads(1)


def _run_esbox(
    strategy: str, options: dict[str, Any], tracker: functions.Tracker, x0: Any, spec: dict
) -> str:
    import esbox

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a ConfigWarning for subspaces > d at tiny d
        result = esbox.optimize(
            tracker, x0, strategy=strategy, budget=spec["budget"], seed=spec["seed"],
            max_time=spec["max_seconds"], **options,
        )  # fmt: skip
    return result.stop_reason


def _run_peer(name: str, tracker: functions.Tracker, x0: Any, spec: dict[str, Any]) -> str:
    searcher = PEERS[name].build(x0, spec["seed"], spec["budget"], None)
    elapsed = measure.stopwatch()
    try:
        while not tracker.spent:
            if elapsed() > spec["max_seconds"]:
                return "max_seconds"
            searcher.step(tracker)
    except functions.BudgetSpent:
        pass
    except Finished as stop:
        return f"stopped: {stop}"
    return "max_evaluations"


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One run: ``spec`` has method, options (esbox only), problem, d, seed, budget,
    max_seconds; returns f0, the best value, evaluations, target hits, seconds, stop reason."""
    fn = functions.problem(spec["problem"])
    x0 = functions.start_point(spec["d"], spec["seed"])
    f0, targets = functions.targets_for(fn, x0, spec.get("targets", functions.TARGETS))
    tracker = functions.Tracker(fn, spec["budget"], targets)
    elapsed = measure.stopwatch()
    method = spec["method"]
    try:
        if method.startswith(ESBOX):
            options = spec.get("options", {})
            reason = _run_esbox(method[len(ESBOX) :], options, tracker, x0, spec)
        else:
            reason = _run_peer(method, tracker, x0, spec)
    except Exception as error:  # one failing method must not end the whole suite
        reason = f"error: {type(error).__name__}: {error}"[:200]
    return {
        **spec,
        "f0": f0,
        "best": tracker.best,
        "evaluations": tracker.evaluations,
        "hits": tracker.hits,
        "seconds": elapsed(),
        "stop": reason,
    }


def run_all(specs: list[dict[str, Any]], jobs: int, progress: bool = True) -> list[dict[str, Any]]:
    """Every spec through :func:`run` in ``jobs`` fresh spawned workers (one thread each), in
    the order given; prints a dot per run when ``progress``."""
    import multiprocessing
    import sys
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # jax and torch do not survive a fork
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=init_worker) as pool:
        results = []
        for result in pool.map(run, specs):
            results.append(result)
            if progress:
                print(".", end="" if len(results) % 100 else "\n", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return results
