"""CMA-ES (Hansen and Ostermeier 2001) by pycma as an esbox strategy: ``cma``, and ``sep-CMA``
(Ros and Hansen 2008) with ``diagonal: true``.

Like the nevergrad bridge, pycma proposes points: a member travels as its displacement from
the current parameters (``Perturbation.values``) and a step as the move to pycma's new mean
(``Update.shift``). pycma searches the displacement from the start point (x0 = 0 with step size
sigma_0) and draws its samples from the strategy's own seeded generator, so a run is
reproducible whatever else uses numpy's global random state. pycma's own termination
criteria (``tolx``, ``tolfun``, ``tolstagnation``, ``conditioncov``...) are the stop reasons
the restarts read (``esbox.restarts``), so the default ``restarts: ipop`` makes it IPOP-CMA-ES.
The state is the losses told, step by step: a resumed run rebuilds pycma with the same seed,
replays them and checks the replay against a digest of every point asked (nothing is
unpickled). Full CMA-ES costs O(d^2) memory and time per sample, so it takes vectors of at most
``max_dimension`` floats.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from esbox.config import option
from esbox.errors import ConfigError, ResumeError
from esbox.registry import register
from esbox.schedules import SCHEDULE_FORM, ScheduleLike
from esbox.shaping import SHAPINGS
from esbox.space import VectorSpace
from esbox.specs import Perturbation
from esbox.strategies.told import ToldStrategy
from esbox.strategy import StrategyOptions

EXTRA_HINT = "strategy cma needs pycma: pip install 'esbox[cma]'"
SIGMA_FORM = "a positive number, pycma's sigma_0 ({kind: adaptive, initial: S0}: S0)"
# pycma's criteria that are budgets, not convergence: the Runner's budget is the one that counts
BUDGET_KEYS = ("maxfevals", "maxiter", "timeout", "maxstd")


def _cma() -> Any:
    try:
        import cma
    except ImportError as exc:
        raise ConfigError(EXTRA_HINT) from exc
    return cma


@register("cma")
class PycmaCMA(ToldStrategy):
    """CMA-ES (or sep-CMA-ES) by pycma on a vector: explicit candidates, pycma's own stops."""

    description = "CMA-ES by pycma (diagonal: sep-CMA), explicit candidates on a vector"
    adapts_sigma = True  # pycma adapts sigma and C: the black-box defaults leave them alone

    @dataclass
    class Options(StrategyOptions):
        population: int = option(16, "lambda: candidates per step (pycma's popsize)", minimum=2)
        sigma: ScheduleLike = option(1.0, "pycma's initial step size sigma_0", form=SIGMA_FORM)
        shaping: str = option("raw", "losses told to pycma (it ranks them)", choices=SHAPINGS)
        learning_rate: ScheduleLike = option(
            1.0, "not used: each step moves to pycma's new mean", form=SCHEDULE_FORM
        )
        diagonal: bool = option(False, "sep-CMA-ES: a diagonal covariance, O(d) per sample")
        max_dimension: int = option(
            4000, "largest vector taken (full CMA: O(d^2) memory and time a sample)", minimum=1
        )

    def __init__(self, dimension: int, *, seed: int = 0, **options: Any) -> None:
        super().__init__(dimension, seed=seed, **options)
        self._es: Any = None
        self._asked: list[np.ndarray] = []
        self._log: list[list[float]] = []
        self._digest = hashlib.sha256()
        self._at = np.zeros(dimension)
        self._init_told(dimension)

    @classmethod
    def check_space(cls, space: Any) -> None:
        """Refuse a space that is not a vector (``make_strategy`` calls this)."""
        if hasattr(space, "dimension") and not isinstance(space, VectorSpace):
            raise ConfigError(
                f"cma optimizes a vector, not a {type(space).__name__}: CMA-ES keeps a d x d "
                f"covariance; use copes, openai_es or esopt for model weights"
            )

    def _validate(self) -> None:
        if self.dimension > self.options.max_dimension:
            raise ConfigError(
                f"cma takes vectors of at most {self.options.max_dimension:,} dimensions (option "
                f"max_dimension), this one has {self.dimension:,}: full CMA-ES costs O(d^2) a "
                f"sample; use diagonal: true (sep-CMA), snes or copes"
            )
        if self.options.optimizer != "sgd" or self.options.momentum or self.options.weight_decay:
            raise ConfigError("cma makes its own steps: optimizer options do not apply")

    def search_scale(self) -> None:
        """No esbox tolx: pycma's own criteria watch its sigma and covariance."""
        return None

    def termination_reason(self) -> str | None:
        """pycma's first convergence criterion that fired (its budgets left out), or None."""
        if self._es is None:
            return None
        stops = [k for k in self._es.stop() if k not in BUDGET_KEYS]
        return stops[0] if stops else None

    # -- pycma's ask and tell ------------------------------------------------------------------
    def _pycma(self) -> Any:
        if self._es is None:
            cma = _cma()
            rng = np.random.Generator(np.random.PCG64(self.seed))
            options = {
                "popsize": self.options.population,
                "seed": self.seed % (2**32 - 1) + 1,
                "randn": lambda *shape: rng.standard_normal(shape),
                "verbose": -9,
                "verb_log": 0,
                "verb_disp": 0,
                "maxfevals": math.inf,
                "CMA_diagonal": bool(self.options.diagonal),
            }
            x0 = np.zeros(self.dimension)
            self._es = cma.CMAEvolutionStrategy(x0, float(self.sigma(0)), options)
        return self._es

    def _ask_points(self) -> np.ndarray:
        points = np.asarray(self._pycma().ask(), dtype=np.float64)
        self._asked = list(points)
        self._digest.update(points.tobytes())
        return points

    def _tell_losses(self, losses: Sequence[float]) -> None:
        """Tell pycma the losses and move to its new mean; a step whose losses are all equal
        teaches nothing and is not told (the parameters stay, as for every strategy)."""
        self._log.append([float(v) for v in losses])
        self._move = np.zeros(self.dimension)
        if max(losses) > min(losses):
            self._es.tell(self._asked, [float(v) for v in losses])
            mean = np.asarray(self._es.mean, dtype=np.float64)
            self._move, self._at = mean - self._at, mean
        self._asked = []

    def _ask(self, sigma: float) -> list[Perturbation]:
        first = self.step * self.options.population
        return [
            replace(self.member(first + i, sigma), values=tuple((x - self._at).tolist()))
            for i, x in enumerate(self._ask_points())
        ]

    # -- state: the replay log -------------------------------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        return {"losses": self._log, "digest": self._digest.hexdigest(),
                "cma": _cma().__version__}  # fmt: skip

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Rebuild pycma by replaying the recorded asks and tells, and check the replay."""
        self._es, self._log, self._digest = None, [], hashlib.sha256()
        self._at = np.zeros(self.dimension)
        for losses in state["losses"]:
            self._ask_points()
            self._tell_losses(losses)
        pending, replayed = self._pending, None
        if pending is not None:
            replayed = self._ask(self.sigma(self.step))
        if replayed != pending or self._digest.hexdigest() != state["digest"]:
            raise ResumeError(
                f"replaying pycma's asks and tells did not reproduce the checkpoint's candidates "
                f"(written with pycma {state['cma']}, this is {_cma().__version__})"
            )
