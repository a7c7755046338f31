"""The Strategy base: owns the bookkeeping so a strategy file only fills in ``_ask``/``_terms``.

A strategy never touches parameters. ``ask()`` returns perturbation specs, ``tell(rewards)``
returns an update spec. Rewards are always maximized; ``esbox.optimize`` negates costs.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from esbox.adaptation import ADAPTIVE_FORM, SigmaAdaptation, SuccessRule, is_adaptive
from esbox.config import build_options, option
from esbox.errors import ConfigError, ResumeError, check_reward_values
from esbox.lowrank import spec_rank
from esbox.optimizers import OPTIMIZERS
from esbox.schedules import (
    SCHEDULE_FORM,
    Constant,
    ScheduleLike,
    make_schedule,
    schedule_to_config,
)
from esbox.shaping import SHAPINGS, sanitize, shape
from esbox.specs import OptimizerSpec, Perturbation, Term, Update

SEED_BOUND = 2**62
SIGMA_FORM = f"{SCHEDULE_FORM}, or {ADAPTIVE_FORM}"


@dataclass
class StrategyOptions:
    """Options every strategy understands."""

    population: int = option(16, "members per step (N)", minimum=1)
    sigma: ScheduleLike = option(
        0.02, "noise scale: a number, a schedule mapping, or {kind: adaptive}", form=SIGMA_FORM
    )
    learning_rate: ScheduleLike = option(
        0.01, "step size: a number or a schedule mapping", form=SCHEDULE_FORM
    )
    shaping: str = option("centered_ranks", "reward shaping", choices=SHAPINGS)
    optimizer: str = option("sgd", "how the gradient estimate becomes a step", choices=OPTIMIZERS)
    momentum: float = option(0.0, "SGD momentum in [0, 1)", minimum=0.0)
    weight_decay: float = option(0.0, "decoupled weight decay (times learning rate)", minimum=0.0)
    beta1: float = option(0.9, "Adam first-moment decay", minimum=0.0)
    beta2: float = option(0.999, "Adam second-moment decay", minimum=0.0)


class Strategy(ABC):
    """Base class: step counter, seed stream, schedules, shaping, best-so-far, metrics, state."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Options: ClassVar[type[StrategyOptions]] = StrategyOptions
    # While sigma adapts, lr_t = lr_0 (sigma_t / sigma_0)^power keeps a step proportional to
    # sigma: 2 for the canonical estimate sum r eps / (N sigma), 1 for reward-weighted updates.
    adaptive_rate_power: ClassVar[int] = 2
    # True when the strategy adapts its own search distribution (SNES's per-coordinate scales):
    # the black-box defaults then leave its sigma and learning rate alone.
    adapts_sigma: ClassVar[bool] = False

    def __init__(self, dimension: int, *, seed: int = 0, **options: Any) -> None:
        if not isinstance(dimension, int) or dimension < 1:
            raise ConfigError(f"dimension must be a positive integer, got {dimension!r}")
        self.dimension = dimension
        self.seed = int(seed)
        self.options = build_options(self.Options, options, where=f"{self.name} option")
        self.sigma_adaptation: SigmaAdaptation | None = None
        try:  # sigma must be > 0 at every step: the gradient estimate divides by it
            if is_adaptive(self.options.sigma):
                rule = SuccessRule.from_config(self.options.sigma)
                self.sigma_adaptation = SigmaAdaptation(rule)
                self.sigma = Constant(rule.initial)
            else:
                self.sigma = make_schedule(self.options.sigma, "sigma", positive=True)
            self.learning_rate = make_schedule(self.options.learning_rate, "learning_rate")
        except ConfigError as exc:
            raise ConfigError(f"{self.name or 'strategy'} option {exc}") from None
        self.optimizer = OptimizerSpec(
            name=self.options.optimizer,
            momentum=self.options.momentum,
            beta1=self.options.beta1,
            beta2=self.options.beta2,
            weight_decay=self.options.weight_decay,
        )
        self._validate()
        self.step = 0
        self.best_reward = -np.inf
        self.best_perturbation: Perturbation | None = None
        self.metrics: dict[str, float] = {}
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._pending: list[Perturbation] | None = None

    # -- hooks for strategy files ------------------------------------------------------------
    def _validate(self) -> None:
        """Check option combinations; raise ConfigError naming the option."""

    @abstractmethod
    def _ask(self, sigma: float) -> list[Perturbation]:
        """The population of this step."""

    @abstractmethod
    def _terms(self, perturbations: Sequence[Perturbation], shaped: np.ndarray) -> list[Term]:
        """The update direction as noise terms, from shaped rewards."""

    def _shape(self, rewards: np.ndarray, perturbations: Sequence[Perturbation]) -> np.ndarray:
        return shape(rewards, self.options.shaping)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    @classmethod
    def vector_defaults(cls, dimension: int) -> dict[str, Any]:
        """The strategy's own black-box defaults on a ``dimension``-d vector (``esbox.defaults``
        adds population, sigma and learning rate); none here."""
        return {}

    @classmethod
    def population_multiple(cls, options: dict[str, Any]) -> int:
        """What a population must be a multiple of under ``options`` (for default sizes)."""
        return 1

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``_extra_state`` saved."""

    # -- helpers ----------------------------------------------------------------------------
    def draw_seeds(self, count: int) -> list[int]:
        """``count`` fresh member seeds from the run's seed stream."""
        return [int(s) for s in self._rng.integers(0, SEED_BOUND, size=count)]

    def member(
        self,
        seed: int,
        scale: float,
        subspace: int = 0,
        num_subspaces: int = 1,
        context: int | None = None,
    ) -> Perturbation:
        """A perturbation spec of this step."""
        return Perturbation(
            self.seed,
            self.step,
            seed,
            scale,
            subspace,
            num_subspaces,
            context,
            rank=spec_rank(self.options),
        )

    def current_sigma(self) -> float:
        """Sigma of this step: the adapted value, or the schedule's at this step."""
        if self.sigma_adaptation is not None:
            return self.sigma_adaptation.sigma
        return self.sigma(self.step)

    def current_learning_rate(self) -> float:
        """The learning rate of this step (following sigma while sigma adapts)."""
        rate = self.learning_rate(self.step)
        if self.sigma_adaptation is not None:
            rate *= self.sigma_adaptation.rate_factor(self.adaptive_rate_power)
        return rate

    # -- ask / tell ------------------------------------------------------------------------------
    def ask(self) -> list[Perturbation]:
        """The population to evaluate; asking again before ``tell`` returns the same one."""
        if self._pending is None:
            self._pending = self._ask(self.current_sigma())
        return list(self._pending)

    def tell(self, rewards: Sequence[float] | np.ndarray) -> Update:
        """Rewards (higher is better) of the last ``ask()``, in order; returns the update."""
        if self._pending is None:
            raise RuntimeError("tell() called without a pending ask(): call ask() first")
        perturbations = self._pending
        check_reward_values(rewards, "the evaluator")
        raw = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if raw.size != len(perturbations):
            raise ValueError(f"tell() got {raw.size} rewards for {len(perturbations)} members")
        clean, n_bad = sanitize(raw)
        shaped = self._shape(clean, perturbations)
        update = Update(
            self.seed,
            self.step,
            tuple(self._terms(perturbations, shaped)),
            self.current_learning_rate(),
            self.optimizer,
            rank=spec_rank(self.options),
        )
        finite = raw[np.isfinite(raw)]
        if finite.size and finite.max() > self.best_reward:
            self.best_reward = float(finite.max())
            self.best_perturbation = perturbations[
                int(np.nanargmax(np.where(np.isfinite(raw), raw, -np.inf)))
            ]
        self.metrics = {
            "step": self.step,
            "sigma": self.current_sigma(),
            "learning_rate": update.learning_rate,
            "reward_mean": float(finite.mean()) if finite.size else float("nan"),
            "reward_std": float(finite.std()) if finite.size else float("nan"),
            "reward_max": float(finite.max()) if finite.size else float("nan"),
            "reward_min": float(finite.min()) if finite.size else float("nan"),
            "best_reward": self.best_reward,
            "nonfinite_rewards": n_bad,
        }
        if self.sigma_adaptation is not None:
            self.sigma_adaptation.observe(clean)
        self.step += 1
        self._pending = None
        return update

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: options, step, seed stream, best-so-far and pending ask."""
        options = dataclasses.asdict(self.options)
        adaptation = self.sigma_adaptation
        options["sigma"] = (
            adaptation.rule.to_config() if adaptation else schedule_to_config(self.sigma)
        )
        options["learning_rate"] = schedule_to_config(self.learning_rate)
        return {
            "name": self.name,
            "seed": self.seed,
            "dimension": self.dimension,
            "options": options,
            "step": self.step,
            "rng": self._rng.bit_generator.state,
            "best_reward": self.best_reward,
            "best_perturbation": self.best_perturbation.to_dict()
            if self.best_perturbation
            else None,
            "pending": [p.to_dict() for p in self._pending] if self._pending is not None else None,
            "extra": self._extra_state(),
            "sigma_adaptation": adaptation.state_dict() if adaptation else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict``; refuses one written by another strategy or configuration."""
        mine = self.state_dict()
        state = {**state, "options": {**self._added_option_defaults(state), **state["options"]}}
        for key in ("name", "seed", "dimension", "options"):
            if state[key] != mine[key]:
                raise ResumeError(
                    f"checkpoint {key} {state[key]!r} differs from this run's {mine[key]!r}"
                )
        self.step = int(state["step"])
        self._rng.bit_generator.state = state["rng"]
        self.best_reward = float(state["best_reward"])
        best = state["best_perturbation"]
        self.best_perturbation = Perturbation(**best) if best else None
        pending = state["pending"]
        self._pending = [Perturbation(**p) for p in pending] if pending is not None else None
        self._load_extra_state(state["extra"])
        if self.sigma_adaptation is not None:
            self.sigma_adaptation.load_state_dict(state["sigma_adaptation"])

    def _added_option_defaults(self, state: dict[str, Any]) -> dict[str, Any]:
        """Defaults of the options added since ``state`` was written (an older checkpoint
        lacks them; it ran with what they default to)."""
        return {
            f.name: f.default
            for f in dataclasses.fields(self.Options)
            if f.name not in state["options"] and f.default is not dataclasses.MISSING
        }

    def peek_seeds(self, count: int = 4) -> list[int]:
        """The next ``count`` seeds of the stream, without consuming them (resume check)."""
        probe = np.random.Generator(np.random.PCG64())
        probe.bit_generator.state = self._rng.bit_generator.state
        return [int(s) for s in probe.integers(0, SEED_BOUND, size=count)]


def nearest_multiples(n: int, step: int) -> str:
    """``"16 or 20"``: the multiples of ``step`` nearest ``n`` (below and above), for hints."""
    below, above = n // step * step, (n // step + 1) * step
    return f"{below} or {above}" if below > 0 else str(above)


def gradient_terms(
    perturbations: Sequence[Perturbation], shaped: np.ndarray, scale_by_sigma: bool = True
) -> list[Term]:
    """Canonical ES terms: g_k = sum_i r_i (sign_i P_k eps_i) / (N_k sigma_k) per subspace.

    Members sharing a seed and subspace (antithetic pairs) merge into one term, halving replay.
    With ``scale_by_sigma=False`` the 1/sigma factor is dropped (the reward-weighted form).
    """
    counts: dict[int, int] = {}
    for p in perturbations:
        counts[p.subspace] = counts.get(p.subspace, 0) + 1
    merged: dict[tuple[int, int, int], float] = {}
    for p, r in zip(perturbations, shaped, strict=True):
        sigma = abs(p.scale) if scale_by_sigma else 1.0
        key = (p.seed, p.subspace, p.num_subspaces)
        merged[key] = merged.get(key, 0.0) + float(r) * p.sign / (counts[p.subspace] * sigma)
    return [Term(seed, coef, k, n) for (seed, k, n), coef in merged.items()]
