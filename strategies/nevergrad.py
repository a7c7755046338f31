"""nevergrad optimizers as esbox strategies: ``ng:NAME`` for any NAME in nevergrad's registry.

nevergrad proposes points, not seeds. A member travels as its displacement from the current
parameters (``Perturbation.values``) and a step as the move to nevergrad's recommendation
(``Update.shift``), so a space realises both with no optimizer at hand. nevergrad searches the
displacement from the start point (an ``ng.p.Array`` at 0 with step size sigma): the strategy
needs only the dimension, and searches as nevergrad does from an Array initialised at x0. A
step asks ``population`` candidates (nevergrad's ``num_workers``) and tells all their losses
(the negated rewards, raw by default). A step whose rewards are all equal (a plateau, or every
reward NaN) teaches nothing and leaves the parameters where they are, as for every strategy.

The state is the losses told, step by step. A resumed run rebuilds the optimizer with the same
seed and replays its asks and tells (nothing is unpickled), then checks that the replay gave
the recorded candidates (a digest of every point asked and recommended) or refuses to resume.
Points travel as d floats each, so the strategy takes vectors of at most ``max_dimension``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from esbox.adaptation import is_adaptive
from esbox.config import option
from esbox.errors import ConfigError, ResumeError, close_match_hint
from esbox.registry import register_family
from esbox.schedules import SCHEDULE_FORM, ScheduleLike
from esbox.shaping import SHAPINGS
from esbox.space import VectorSpace
from esbox.specs import Perturbation
from esbox.strategies.told import ToldStrategy
from esbox.strategy import StrategyOptions

if TYPE_CHECKING:
    from esbox.runner import Budget

EXTRA_HINT = "ng: strategies need nevergrad: pip install 'esbox[nevergrad]'"
SIGMA_FORM = "a positive number (nevergrad's initial step size) or {kind: adaptive, initial: S0}"
EXAMPLES = "ng:NGOpt, ng:CMA, ng:DiagonalCMA, ng:OnePlusOne, ng:TwoPointsDE, ng:PSO"
MAX_DIMENSION = 10_000
GRADIENT_ONLY = ("optimizer", "momentum", "weight_decay", "beta1", "beta2")


def _nevergrad() -> Any:
    try:
        import nevergrad
    except ImportError as exc:
        raise ConfigError(EXTRA_HINT) from exc
    return nevergrad


def optimizer_names() -> list[str]:
    """Every optimizer name in nevergrad's registry (several hundred), sorted."""
    return sorted(_nevergrad().optimizers.registry)


class NevergradStrategy(ToldStrategy):
    """A nevergrad optimizer behind the Strategy interface, on a vector (see the module doc)."""

    optimizer_name: ClassVar[str] = ""

    @dataclass
    class Options(StrategyOptions):
        population: int = option(
            16, "candidates asked and told per step (nevergrad's num_workers)", minimum=1
        )
        sigma: ScheduleLike = option(
            1.0, "initial step size of nevergrad's Array (nevergrad adapts it)", form=SIGMA_FORM
        )
        shaping: str = option(
            "raw",
            "losses told to nevergrad: negated rewards (raw) or shaped ones",
            choices=SHAPINGS,
        )
        learning_rate: ScheduleLike = option(
            0.01, "not used: each step moves to nevergrad's recommendation", form=SCHEDULE_FORM
        )
        ng_budget: int | None = option(
            None,
            "evaluations nevergrad plans for (NGOpt picks its algorithm by it); "
            "null: the run's budget",
            minimum=1,
        )
        max_dimension: int = option(
            MAX_DIMENSION, "largest vector taken: each candidate travels as d floats", minimum=1
        )

    def __init__(self, dimension: int, *, seed: int = 0, **options: Any) -> None:
        if "sigma" in options:
            options["sigma"] = _initial_sigma(options["sigma"], self.name)
        super().__init__(dimension, seed=seed, **options)
        self._planned: int | None = self.options.ng_budget
        self._optimizer: Any = None  # built at the first ask, once the run's budget is known
        self._asked: list[Any] = []  # nevergrad's candidates of the pending ask
        self._log: list[list[float]] = []  # the losses told, step by step: the replay log
        self._digest = hashlib.sha256()
        self._at = np.zeros(dimension)  # the parameters' displacement from the start
        self._init_told(dimension)

    @classmethod
    def check_space(cls, space: Any) -> None:
        """Refuse a space that is not a vector (``make_strategy`` calls this)."""
        if hasattr(space, "dimension") and not isinstance(space, VectorSpace):
            raise ConfigError(
                f"{cls.name} optimizes a vector (a function of x) of at most max_dimension "
                f"(default {MAX_DIMENSION:,}) floats, not a {type(space).__name__} of "
                f"{space.dimension:,} parameters: nevergrad proposes whole points; use copes, "
                f"openai_es or esopt for model weights"
            )

    def _validate(self) -> None:
        limit = self.options.max_dimension
        if self.dimension > limit:
            raise ConfigError(
                f"{self.name} takes vectors of at most {limit:,} dimensions (option "
                f"max_dimension), this space has {self.dimension:,}: each candidate travels "
                f"as d floats and nevergrad keeps O(d) to O(d^2) per point; use copes, "
                f"openai_es or esopt for large spaces"
            )
        defaults = {f.name: f.default for f in fields(StrategyOptions)}
        for key in GRADIENT_ONLY:
            if getattr(self.options, key) != defaults[key]:
                raise ConfigError(
                    f"{self.name} option '{key}' does not apply: nevergrad makes its own steps "
                    f"(leave it at {defaults[key]!r})"
                )
        if self.options.population == 1 and self.options.shaping != "raw":
            raise ConfigError(
                f"{self.name} option 'shaping' must be raw with population 1: a lone reward "
                f"shapes to 0, which would tell nevergrad nothing"
            )
        factory = _nevergrad().optimizers.registry[self.optimizer_name]
        if factory.no_parallelization and self.options.population > 1:
            raise ConfigError(
                f"{self.name} evaluates one candidate at a time (nevergrad: no "
                f"parallelization); set population: 1"
            )

    def plan_budget(self, budget: Budget) -> None:
        """The Runner's budget becomes nevergrad's, unless option ``ng_budget`` sets one (the
        plan made before the first ask counts)."""
        if self.options.ng_budget is not None or self._optimizer is not None:
            return
        steps = budget.max_steps * self.options.population if budget.max_steps else None
        limits = [n for n in (budget.max_evaluations, steps) if n is not None]
        self._planned = min(limits) if limits else None

    # -- nevergrad's ask and tell ------------------------------------------------------------
    def _nevergrad_optimizer(self) -> Any:
        if self._optimizer is None:
            ng = _nevergrad()
            array = ng.p.Array(init=np.zeros(self.dimension)).set_mutation(sigma=self.sigma(0))
            seeds = np.random.SeedSequence(self.seed)
            array.random_state = np.random.RandomState(np.random.MT19937(seeds))
            factory = ng.optimizers.registry[self.optimizer_name]
            self._optimizer = factory(
                parametrization=array, budget=self._planned, num_workers=self.options.population
            )
        return self._optimizer

    def _ask_points(self) -> np.ndarray:
        """Ask nevergrad for ``population`` candidates; their points as an (N, d) array."""
        optimizer = self._nevergrad_optimizer()
        try:
            self._asked = [optimizer.ask() for _ in range(self.options.population)]
        except AssertionError:
            if self._planned is not None:
                raise
            raise ConfigError(
                f"{self.name} needs to know its budget (nevergrad picks its algorithm by it): "
                f"run it with a budget of evaluations or steps, or set option ng_budget"
            ) from None
        points = np.stack([np.asarray(c.value, dtype=np.float64).reshape(-1) for c in self._asked])
        self._digest.update(points.tobytes())
        return points

    def _tell_losses(self, losses: Sequence[float]) -> None:
        """Tell the pending candidates their losses; move to the recommendation unless the
        step's losses are all equal (nothing learned)."""
        for candidate, loss in zip(self._asked, losses, strict=True):
            self._optimizer.tell(candidate, float(loss))
        self._asked = []
        self._log.append([float(loss) for loss in losses])
        self._move = np.zeros(self.dimension)
        if len(losses) == 1 or max(losses) > min(losses):
            value = self._optimizer.provide_recommendation().value
            recommended = np.asarray(value, dtype=np.float64).reshape(-1)
            self._digest.update(recommended.tobytes())
            self._move, self._at = recommended - self._at, recommended

    def _ask(self, sigma: float) -> list[Perturbation]:
        first = self.step * self.options.population
        return [
            replace(self.member(first + i, sigma), values=tuple((x - self._at).tolist()))
            for i, x in enumerate(self._ask_points())
        ]

    # -- state: the replay log -------------------------------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        return {
            "losses": self._log,
            "digest": self._digest.hexdigest(),
            "budget": self._planned,
            "nevergrad": _nevergrad().__version__,
        }

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Rebuild nevergrad by replaying the recorded asks and tells, and check the replay."""
        self._planned = state["budget"]  # a resumed run keeps the budget nevergrad planned for
        self._optimizer, self._log, self._digest = None, [], hashlib.sha256()
        self._at = np.zeros(self.dimension)
        for losses in state["losses"]:
            self._ask_points()
            self._tell_losses(losses)
        pending, replayed = self._pending, None
        if pending is not None:
            replayed = self._ask(self.sigma(self.step))
        if replayed != pending or self._digest.hexdigest() != state["digest"]:
            raise ResumeError(
                f"replaying {self.name}'s asks and tells did not reproduce the checkpoint's "
                f"candidates (written with nevergrad {state['nevergrad']}, this is "
                f"{_nevergrad().__version__}); resume with the nevergrad that wrote it"
            )


def _initial_sigma(spec: Any, name: str) -> Any:
    """sigma_0 from a number or ``{kind: adaptive, initial: S0}`` (nevergrad adapts sigma
    itself); a schedule is refused."""
    if is_adaptive(spec):
        extra = sorted(set(spec) - {"kind", "initial"})
        if extra:
            raise ConfigError(
                f"{name} option 'sigma' takes {SIGMA_FORM}; nevergrad adapts sigma its own "
                f"way, so '{extra[0]}' does not apply"
            )
        return spec.get("initial", 1.0)
    if isinstance(spec, dict):
        raise ConfigError(
            f"{name} option 'sigma' must be {SIGMA_FORM} (nevergrad adapts it, so it takes no "
            f"schedule); got {spec!r:.80}"
        )
    return spec


@cache
def nevergrad_strategy(name: str) -> type[NevergradStrategy]:
    """The strategy class of ``ng:NAME`` (one class per name, built on first use)."""
    registry = _nevergrad().optimizers.registry
    if name not in registry:
        raise ConfigError(
            f"unknown nevergrad optimizer 'ng:{name}'"
            f"{close_match_hint(f'ng:{name}', [f'ng:{known}' for known in registry])} "
            f"(nevergrad has {len(registry)}, e.g. {EXAMPLES}; all of them: "
            f"esbox.strategies.nevergrad.optimizer_names())"
        )
    doc = f"nevergrad's {name} behind the Strategy interface, on a vector."
    return type(
        f"Nevergrad_{name}",
        (NevergradStrategy,),
        {
            "name": f"ng:{name}",
            "optimizer_name": name,
            "description": f"nevergrad's {name}: explicit candidates on a vector",
            "__doc__": doc,
            "__module__": __name__,
        },
    )


register_family(
    "ng",
    nevergrad_strategy,
    f"any nevergrad optimizer on a vector: {EXAMPLES}, ... (all of them: "
    f"python -c 'from esbox.strategies.nevergrad import optimizer_names as n; print(*n())')",
)
