"""An esbox strategy as a nevergrad optimizer, in nevergrad's standardized coordinates.

The strategy keeps its own mean theta in a ``VectorSpace`` of nevergrad's standardized data (0
is the Array's init, 1 its step size), so bounds and transforms of an ``ng.p.Array`` act as
nevergrad defines them. ``ask`` hands out the members of the pending population in order, each
as a point; once every member of the step is told, the strategy's update is applied and the
next population starts. Asks beyond the population (nevergrad's workers outnumbering the
members still out) evaluate the mean itself, whose loss does not enter the update; tells of an
earlier step's candidates are ignored likewise. The recommendation is the mean.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from nevergrad.common import errors
from nevergrad.optimization import base
from nevergrad.parametrization import parameter as p

from esbox.defaults import default_population
from esbox.registry import get_strategy, make_strategy
from esbox.space import VectorSpace
from esbox.strategy import Strategy


def population_for(
    strategy: type[Strategy], dimension: int, num_workers: int, options: dict[str, Any]
) -> int:
    """The black-box population, raised to a multiple of ``num_workers`` (and of what the
    strategy needs), so that batches of asks fill steps exactly."""
    options = {**strategy.vector_defaults(dimension), **options}  # e.g. CoPES's K <= d
    unit = strategy.population_multiple(options)
    unit = unit * num_workers // math.gcd(unit, num_workers)
    wanted = max(default_population(strategy, dimension, options), num_workers)
    return math.ceil(wanted / unit) * unit


class _ESBoxOptimizer(base.Optimizer):
    """nevergrad's ask/tell over an esbox strategy's populations (see the module doc)."""

    def __init__(
        self,
        parametrization: Any,
        budget: int | None = None,
        num_workers: int = 1,
        *,
        strategy: str = "copes",
        options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(parametrization, budget=budget, num_workers=num_workers)
        if not isinstance(self.parametrization, p.Array):
            raise TypeError(
                f"esbox strategies optimize an ng.p.Array (bounded or not; any shape), got "
                f"{type(self.parametrization).__name__}: choices, instrumentations and "
                f"other parametrizations need one of nevergrad's own optimizers"
            )
        options = dict(options or {})
        if "population" not in options:
            cls = get_strategy(strategy)
            options["population"] = population_for(cls, self.dimension, num_workers, options)
        self._space = VectorSpace(np.zeros(self.dimension))
        seed = int(self._rng.randint(2**31))  # nevergrad's seeding reaches the strategy
        self.strategy = make_strategy(strategy, self._space, seed=seed, **options)
        self._handed = 0  # members of the pending population handed out so far
        self._losses: dict[int, float] = {}  # member index -> loss, for the pending step
        self._sources: dict[str, tuple[int, int]] = {}  # candidate uid -> (step, member or -1)

    def _internal_ask_candidate(self) -> p.Parameter:
        members = self.strategy.ask()
        if self._handed < len(members):
            index, self._handed = self._handed, self._handed + 1
            data = self._space.materialize(members[index])
        else:  # every member is out: a spare worker evaluates the mean
            index, data = -1, self._space.vector.copy()
        candidate = self.parametrization.spawn_child().set_standardized_data(data)
        self._sources[candidate.uid] = (self.strategy.step, index)
        return candidate

    def _internal_tell_candidate(self, candidate: p.Parameter, loss: Any) -> None:
        step, index = self._sources.pop(candidate.uid, (-1, -1))
        if step != self.strategy.step or index < 0 or index in self._losses:
            return  # the mean, a candidate of an earlier step or a member told twice
        self._losses[index] = float(loss)
        population = len(self.strategy.ask())
        if len(self._losses) == population:
            rewards = -np.array([self._losses[i] for i in range(population)])
            self._space.apply(self.strategy.tell(rewards))
            self._losses, self._handed = {}, 0

    def _internal_tell_not_asked(self, candidate: p.Parameter, loss: Any) -> None:
        raise errors.TellNotAskedNotSupportedError(
            f"{self.name} learns only from the members it asked (an esbox population)"
        )

    def _internal_provide_recommendation(self) -> np.ndarray:
        return self._space.vector.copy()


class ESBox(base.ConfiguredOptimizer):
    """An esbox strategy as a nevergrad optimizer family:
    ``ESBox(strategy="copes", options={"subspaces": 2})(parametrization, budget, num_workers)``.
    Options left out get esbox's black-box defaults (population 4 + 3 ln d, raised to a multiple
    of ``num_workers``; sigma adapted from nevergrad's unit step size)."""

    def __init__(self, *, strategy: str = "copes", options: dict[str, Any] | None = None) -> None:
        super().__init__(_ESBoxOptimizer, locals())
