"""The peer libraries behind one interface: ``searcher.step(objective)`` is one generation.

Each :class:`Peer` builds a searcher from ``x0``, a seed, a budget in evaluations and
optionally a population; ``step`` asks for candidates, scores them with ``objective`` (a
batch (n, d) to (n,), to minimize) and tells the values back. A peer whose library is not
installed is skipped by the suites with a printed note (``benchmarks/requirements.txt``
installs them all). How each is configured, following its own docs, is in
``docs/benchmarks.md`` and in :data:`PEERS`' ``how`` lines.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

SIGMA0 = 2.0  # initial step size: the optimum lies within x0 +- 3 sigma0 (pycma's rule)
Objective = Callable[[np.ndarray], np.ndarray]


class Finished(Exception):
    """Raised by a searcher that stopped on its own criteria (e.g. pycma's tolfun)."""


class Searcher(Protocol):
    """One optimizer instance; ``objective`` maps a batch (n, d) to n values (any float
    dtype: each library hands over its own population without a copy)."""

    def step(self, objective: Objective) -> None:
        """One generation: ask, evaluate with ``objective``, tell."""


def default_population(d: int) -> int:
    """4 + floor(3 ln d), rounded up to even: CMA's default, used where a library has none."""
    n = 4 + int(3 * math.log(d))
    return n + n % 2


# -- nevergrad -------------------------------------------------------------------------------
class NevergradSearcher:
    """A nevergrad optimizer on an unbounded Array with sigma = SIGMA0; ``population`` asks
    and tells per step, as many workers (the quality suite: 1, one candidate at a time)."""

    def __init__(self, optimizer: Any, x0: np.ndarray, seed: int, budget: int, population: int):
        import nevergrad as ng

        parametrization = ng.p.Array(init=x0).set_mutation(sigma=SIGMA0)
        parametrization.random_state = np.random.RandomState(seed)
        self.optimizer = optimizer(
            parametrization=parametrization, budget=budget, num_workers=population
        )
        self.population = population

    def step(self, objective: Objective) -> None:
        candidates = [self.optimizer.ask() for _ in range(self.population)]
        values = [objective(c.value[None])[0] for c in candidates]
        for candidate, value in zip(candidates, values, strict=True):
            self.optimizer.tell(candidate, float(value))


def _nevergrad(name: str) -> Callable[..., Searcher]:
    def build(x0: np.ndarray, seed: int, budget: int, population: int | None) -> Searcher:
        import nevergrad as ng

        if population is None:
            optimizer = ng.optimizers.registry[name]
        else:  # the overhead suite's fixed population, for the CMA family
            optimizer = ng.families.ParametrizedCMA(diagonal=True, popsize=population)
        return NevergradSearcher(optimizer, x0, seed, budget, population or 1)

    return build


# -- pycma ------------------------------------------------------------------------------------
FULL_CMA_MAX_D = 100  # pycma: full covariance up to here, sep-CMA (CMA_diagonal) above


class PycmaSearcher:
    """pycma's CMAEvolutionStrategy from x0 with sigma0 = SIGMA0; sep-CMA above d = 100."""

    def __init__(self, x0: np.ndarray, seed: int, budget: int, population: int | None):
        import cma

        options: dict[str, Any] = {"seed": seed + 1, "verbose": -9, "maxfevals": budget}
        if x0.size > FULL_CMA_MAX_D:
            options["CMA_diagonal"] = True
        if population is not None:
            options["popsize"] = population
        self.es = cma.CMAEvolutionStrategy(x0, SIGMA0, options)

    def step(self, objective: Objective) -> None:
        if self.es.stop():
            raise Finished(str(self.es.stop()))
        candidates = self.es.ask()
        self.es.tell(candidates, [float(objective(x[None])[0]) for x in candidates])


# -- evosax (JAX, CPU) ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _evosax_algorithm(name: str, d: int, population: int) -> Any:
    """One instance per shape and process: evosax's jit cache is keyed on the instance, so
    reusing it across seeds compiles ask/tell once, as a user's loop would."""
    import jax.numpy as jnp
    from evosax.algorithms import algorithms

    return algorithms[name](population_size=population, solution=jnp.zeros(d, jnp.float32))


class EvosaxSearcher:
    """An evosax algorithm with its default constructor arguments and ``default_params``."""

    def __init__(self, name: str, x0: np.ndarray, seed: int, population: int | None):
        import jax
        import jax.numpy as jnp

        self.jnp = jnp
        self.jax = jax
        solution = jnp.asarray(x0, dtype=jnp.float32)
        self.es = _evosax_algorithm(name, x0.size, population or default_population(x0.size))
        self.params = self.es.default_params
        self.key = jax.random.key(seed)
        self.key, init_key = jax.random.split(self.key)
        self.state = self.es.init(init_key, solution, self.params)

    def step(self, objective: Objective) -> None:
        self.key, ask_key, tell_key = self.jax.random.split(self.key, 3)
        population, self.state = self.es.ask(ask_key, self.state, self.params)
        values = objective(np.asarray(population))
        self.state, _ = self.es.tell(
            tell_key, population, self.jnp.asarray(values, dtype=self.jnp.float32), self.state,
            self.params,
        )  # fmt: skip


# -- EvoTorch ------------------------------------------------------------------------------------
class EvotorchSearcher:
    """An EvoTorch searcher on a vectorised ``Problem``; ``step`` is the searcher's own step."""

    def __init__(self, name: str, x0: np.ndarray, seed: int, population: int | None):
        import logging

        import torch
        from evotorch import Problem
        from evotorch.algorithms import PGPE, SNES

        logging.getLogger("evotorch").setLevel(logging.WARNING)  # an INFO line per Problem

        self.objective: Objective | None = None
        d = x0.size
        problem = Problem(
            "min", self._evaluate, solution_length=d, initial_bounds=(-1.0, 1.0),
            dtype=torch.float32, vectorized=True, seed=seed,
        )  # fmt: skip
        center = torch.as_tensor(x0, dtype=torch.float32)
        if name == "SNES":  # NES learning rates and popsize are SNES's defaults
            self.searcher = SNES(problem, stdev_init=SIGMA0, center_init=center, popsize=population)
        else:  # PGPE has no defaults: the ClipUp recipe of EvoTorch's docs (see docs/benchmarks.md)
            radius = SIGMA0 * math.sqrt(d)
            max_speed = radius / 15.0
            self.searcher = PGPE(
                problem, popsize=population or default_population(d), radius_init=radius,
                center_learning_rate=max_speed / 2.0, stdev_learning_rate=0.1,
                optimizer="clipup", optimizer_config={"max_speed": max_speed}, center_init=center,
            )  # fmt: skip

    def _evaluate(self, solutions: Any) -> Any:
        import torch

        assert self.objective is not None
        values = self.objective(solutions.detach().cpu().numpy())
        return torch.as_tensor(values, dtype=torch.float32)

    def step(self, objective: Objective) -> None:
        self.objective = objective
        self.searcher.step()


@dataclass(frozen=True)
class Peer:
    """A peer optimizer: its library (the import that must succeed), builder and setup."""

    name: str
    library: str
    build: Callable[[np.ndarray, int, int, int | None], Searcher]
    how: str
    value_bytes: int = 8  # bytes per population entry (float64; 4 for the float32 libraries)

    def available(self) -> bool:
        """Whether the library imports (not just whether it is on the path)."""
        try:
            importlib.import_module(self.library)
        except ImportError:
            return False
        return True


PEERS: dict[str, Peer] = {
    p.name: p
    for p in [
        Peer(
            "ng-NGOpt",
            "nevergrad",
            _nevergrad("NGOpt"),
            "nevergrad NGOpt (its recommended default), budget given, num_workers=1, "
            "Array(init=x0).set_mutation(sigma=2)",
        ),
        Peer(
            "ng-DiagonalCMA",
            "nevergrad",
            _nevergrad("DiagonalCMA"),
            "nevergrad DiagonalCMA, same parametrization (overhead: ParametrizedCMA(diagonal, "
            "popsize=N))",
        ),
        Peer(
            "pycma",
            "cma",
            PycmaSearcher,
            "cma.CMAEvolutionStrategy(x0, sigma0=2), default popsize; CMA_diagonal=True "
            "(sep-CMA) for d > 100",
        ),
        Peer(
            "evosax-Open_ES",
            "evosax",
            lambda x0, seed, budget, n: EvosaxSearcher("Open_ES", x0, seed, n),
            "evosax Open_ES defaults: std 1.0 constant, SGD lr 1e-3, centered ranks, "
            "antithetic; population 4 + 3 ln d",
            4,
        ),
        Peer(
            "evosax-SNES",
            "evosax",
            lambda x0, seed, budget, n: EvosaxSearcher("SNES", x0, seed, n),
            "evosax SNES defaults: std_init 1.0, NES weights and learning rates; population "
            "4 + 3 ln d",
            4,
        ),
        Peer(
            "evotorch-SNES",
            "evotorch",
            lambda x0, seed, budget, n: EvotorchSearcher("SNES", x0, seed, n),
            "EvoTorch SNES defaults (popsize, NES learning rates), stdev_init=2",
            4,
        ),
        Peer(
            "evotorch-PGPE",
            "evotorch",
            lambda x0, seed, budget, n: EvotorchSearcher("PGPE", x0, seed, n),
            "EvoTorch PGPE with ClipUp as its docs advise: radius_init = 2 sqrt(d), "
            "max_speed = radius/15, center lr = max_speed/2, stdev lr 0.1",
            4,
        ),
    ]
}


def split_available(names: list[str]) -> tuple[list[str], list[str]]:
    """The peers of ``names`` whose library imports, and the notes for those skipped."""
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise ValueError(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    ready = [n for n in names if PEERS[n].available()]
    notes = [
        f"{n}: skipped, `{PEERS[n].library}` is not installed "
        f"(pip install -c constraints/cpu.txt -r benchmarks/requirements.txt)"
        for n in names
        if n not in ready
    ]
    return ready, notes
