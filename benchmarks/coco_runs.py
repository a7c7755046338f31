"""The runs of the COCO suite, one (method, suite, dimension) a worker process.

:func:`run` takes a plain dict and runs its method on every problem of a ``cocoex`` suite
(bbob or bbob-largescale, the given functions, instances and dimension) with a cocoex
``Observer``, which writes the standard COCO data folder that ``cocopp`` reads. Beside it, each
problem's objective is wrapped to record, for each of COCO's 51 targets f_opt + 10^{2..-8},
the evaluations and the CPU seconds of this process when it was first reached (for the
ECDFs against CPU seconds, which COCO does not record). Methods: ``esbox:NAME`` runs
``esbox.optimize(f, x0, strategy=NAME, budget=B, seed=instance, bounds=domain)`` with no
other option (``esbox:auto`` is esbox's default; ``bounds``, the problem's domain, is what
pycma gets through ``initial_solution_proposal``: restarts start uniformly in it); the peers
are configured as in their docs (COCO's pycma example: sigma_0 = 2, restarts from
``initial_solution_proposal``).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
import warnings
from typing import Any

import numpy as np

TARGETS = tuple(10.0 ** (2 - i / 5) for i in range(51))  # 1e2 ... 1e-8, 5 a decade
SIGMA0 = 2.0
PEERS = {
    "pycma-ipop": "cma.fmin2(f, initial_solution_proposal, 2, restarts=9, incpopsize=2): IPOP",
    "pycma-sep": "the same with CMA_diagonal=True: IPOP-sep-CMA-ES",
    "ng-NGOpt": "nevergrad NGOpt on an Array(init=x0) with sigma 2, budget B, one worker",
    "ng-DiagonalCMA": "nevergrad DiagonalCMA, the same",
}


class Recorder:
    """The objective of one problem: counts evaluations, records when each target was first
    reached (evaluations and CPU seconds since the start) and stops at the final target."""

    def __init__(self, problem: Any, budget: int, f_opt: float) -> None:
        self.problem, self.budget, self.f_opt = problem, budget, f_opt
        self.evaluations, self.best, self.next = 0, math.inf, 0
        self.hits: list[tuple[int, float] | None] = [None] * len(TARGETS)
        self.start = time.process_time()

    def __call__(self, x: np.ndarray) -> float:
        value = float(self.problem(np.asarray(x, dtype=np.float64)))
        self.evaluations += 1
        if value < self.best:
            self.best = value
            while self.next < len(TARGETS) and value - self.f_opt <= TARGETS[self.next]:
                self.hits[self.next] = (self.evaluations, time.process_time() - self.start)
                self.next += 1
        return value

    @property
    def done(self) -> bool:
        return self.next == len(TARGETS) or self.evaluations >= self.budget


def _esbox(name: str, f: Recorder, x0: np.ndarray, seed: int, bounds: tuple) -> None:
    import esbox

    def stop(runner: Any, metrics: Any) -> bool:  # the final target: stop, as COCO's loop does
        return f.next == len(TARGETS)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        esbox.optimize(
            f, x0, strategy=name, budget=f.budget, seed=seed, callbacks=[stop], bounds=bounds
        )


def _pycma(f: Recorder, problem: Any, seed: int, diagonal: bool) -> None:
    import cma

    options = {"maxfevals": f.budget, "verbose": -9, "seed": seed + 1, "CMA_diagonal": diagonal,
               "termination_callback": lambda es: f.done}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cma.fmin2(f, problem.initial_solution_proposal, SIGMA0, options, restarts=9,
                  incpopsize=2)  # fmt: skip


def _nevergrad(name: str, f: Recorder, x0: np.ndarray, seed: int) -> None:
    import nevergrad as ng

    array = ng.p.Array(init=x0).set_mutation(sigma=SIGMA0)
    array.random_state = np.random.RandomState(seed)
    optimizer = ng.optimizers.registry[name](parametrization=array, budget=f.budget)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while not f.done:
            candidate = optimizer.ask()
            optimizer.tell(candidate, f(candidate.value))


def _warm_imports(method: str) -> None:
    """Import the method's libraries before any clock starts (their import is no run's cost)."""
    import importlib

    for name in ("esbox", "esbox.strategies", "cma", "nevergrad"):
        if name == "nevergrad" and not method.startswith("ng-"):
            continue
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def optimum_value(problem: Any) -> float:
    """f_opt of an unobserved cocoex problem: f at the x_opt it prints (into a temp folder)."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            problem._best_parameter("print")
            x_opt = np.loadtxt("._bbob_problem_best_parameter.txt", ndmin=1)
        finally:
            os.chdir(here)
    value = float(problem(x_opt))
    problem.free()
    return value


def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every problem of the spec's suite and dimension with its method; one row each."""
    import cocoex

    _warm_imports(spec["method"])
    method, suite_name, d = spec["method"], spec["suite"], spec["d"]
    functions = ",".join(str(i) for i in spec["functions"])
    instances = ",".join(str(i) for i in spec["instances"])
    suite = cocoex.Suite(
        suite_name, f"instances: {instances}", f"dimensions: {d} function_indices: {functions}"
    )
    os.makedirs(spec["root"], exist_ok=True)
    os.chdir(spec["root"])  # cocoex writes into ./exdata/FOLDER
    observer = cocoex.Observer(
        "bbob", f"result_folder: {spec['folder']} algorithm_name: {spec['algorithm']}"
    )
    reference = cocoex.Suite(  # the same problems, unobserved: f_opt = f(x_opt) there
        suite_name, f"instances: {instances}", f"dimensions: {d} function_indices: {functions}"
    )
    rows = []
    for problem, twin in zip(suite, reference, strict=True):
        problem.observe_with(observer)
        f = Recorder(problem, int(spec["multiplier"] * d), optimum_value(twin))
        x0 = np.array(problem.initial_solution, dtype=np.float64)
        seed = int(problem.id_instance)
        error = ""
        try:
            if method.startswith("esbox:"):
                domain = (np.array(problem.lower_bounds), np.array(problem.upper_bounds))
                _esbox(method.removeprefix("esbox:"), f, x0, seed, domain)
            elif method in ("pycma-ipop", "pycma-sep"):
                _pycma(f, problem, seed, method == "pycma-sep")
            else:
                _nevergrad(method.removeprefix("ng-"), f, x0, seed)
        except Exception as exc:  # one broken run is a row, not a lost suite
            error = f"error: {type(exc).__name__}: {exc}"[:200]
        rows.append({"method": method, "suite": suite_name, "d": d,
                     "function": int(problem.id_function), "instance": seed,
                     "evaluations": f.evaluations, "budget": f.budget,
                     "best": f.best - f.f_opt, "cpu_seconds": time.process_time() - f.start,
                     "hits": f.hits, "error": error})  # fmt: skip
        problem.free()
    return rows
