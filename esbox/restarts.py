"""Termination criteria and restarts (IPOP, BIPOP) on vector spaces, for any strategy.

A run on a vector must not spend its budget at a collapsed sigma. ``Restarting`` wraps the
strategy of a run: after every step it checks the criteria of ``Termination`` (sigma below
``tolx`` relative to x, no improvement beyond ``tolfun`` over k steps, a stagnating median),
or a strategy's own criteria instead where it has them (pycma's: esbox's tolfun on the best so
far would end a CMA-ES restart whose samples still spread widely, long before pycma's own);
when one fires it restarts (IPOP: population x2, sigma reset, a new start point drawn from the
seed; BIPOP: alternates that with short runs of small populations and smaller sigma) or,
with ``kind: stop``, ends the run with the criterion as its stop reason. A restart is an
explicit update (``restart=True``: the space moves to the start point its ``shift`` holds and
drops its optimizer state and per-coordinate scales), so replicas follow it like any update.
Restarts live in the strategy's state, so a resume across a restart is bit-identical. Model spaces
never restart (a restart would throw away training). The maths: docs/strategies.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from esbox.adaptation import is_adaptive
from esbox.errors import ConfigError
from esbox.space import VectorSpace
from esbox.specs import Perturbation, Update
from esbox.strategy import SEED_BOUND, Strategy
from esbox.termination import RestartOptions, Termination, restart_options

__all__ = ["RestartOptions", "Restarting", "Termination", "restart_options", "restarting"]

Build = Callable[..., Strategy]  # build(seed, **option_overrides) -> the strategy of a restart
Start = Callable[[int], np.ndarray]  # start(seed) -> a new start point


def resolve_kind(
    options: RestartOptions,
    space: Any,
    strategy: type[Strategy],
    vector: bool | None = None,
    adaptive: bool = True,
) -> str:
    """The kind ``auto`` stands for here: ipop on a vector (``vector``; default: a
    ``VectorSpace``) with a seed strategy whose sigma adapts (``adaptive``), else none: a
    fixed or scheduled sigma does not collapse, and its best member lags its mean."""
    vector = isinstance(space, VectorSpace) if vector is None else vector
    if options.kind != "auto":
        if options.kind != "none" and not vector:
            raise ConfigError(
                f"restarts.kind {options.kind} restarts from a new point of a vector; this "
                f"space is a {type(space).__name__} (set restarts.kind: none)"
            )
        return options.kind
    explicit = getattr(strategy, "optimizer_name", "")  # nevergrad plans its own budget
    return "ipop" if vector and adaptive and not explicit else "none"


def derived_seed(seed: int, index: int, salt: int = 0) -> int:
    """A seed of restart ``index`` of the run seed ``seed`` (restart 0 keeps ``seed``)."""
    if index == 0 and salt == 0:
        return int(seed)
    state = np.random.SeedSequence([int(seed), index, salt]).generate_state(2, np.uint64)
    return int((int(state[0]) << 32 ^ int(state[1])) % SEED_BOUND)


def gaussian_start(x0: np.ndarray, scale: float) -> Start:
    """Start points ``x0 + scale N(0, I)`` drawn from a seed."""
    x0 = np.array(x0, dtype=np.float64, copy=True)
    return lambda seed: x0 + scale * np.random.default_rng(seed).standard_normal(x0.size)


def uniform_start(lower: np.ndarray, upper: np.ndarray) -> Start:
    """Start points uniform in the box [lower, upper] drawn from a seed (a function's domain)."""
    lower, upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    return lambda seed: np.random.default_rng(seed).uniform(lower, upper)


def _scaled(spec: Any, factor: float) -> Any:
    """A sigma or learning-rate option times ``factor`` (numbers and adaptive sigma only)."""
    if factor == 1.0:
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return float(spec) * factor
    if is_adaptive(spec):
        return {**spec, "initial": float(spec.get("initial", 1.0)) * factor}
    return spec


class Restarting:
    """A strategy that restarts the one it wraps (see the module docstring); it looks like a
    ``Strategy`` to the Runner: ``step`` counts every step of every restart."""

    def __init__(
        self,
        build: Build,
        space: Any,
        options: RestartOptions,
        *,
        seed: int,
        start: Start,
        kind: str | None = None,
    ) -> None:
        self.build, self.space, self.restart_options = build, space, options
        self.seed = int(seed)
        self.kind = kind or options.kind
        self.start = start
        self.inner = build(self.seed)
        first = self.inner.options
        self._base = {"population": first.population, "sigma": first.sigma,
                      "learning_rate": first.learning_rate}  # fmt: skip
        self._multiple = type(self.inner).population_multiple(dataclasses.asdict(first))
        self.index, self.offset, self.large = 0, 0, 0
        self.spent = {"large": 0, "small": 0}  # BIPOP: evaluations of each regime
        self.regime, self.overrides = "large", {}
        self.restart_log: list[dict[str, Any]] = []  # one record per ended restart
        self.terminated: str | None = None  # set when a criterion ends the run
        self.best_reward = -np.inf
        self.metrics: dict[str, float] = {}
        self._budget: Any = None
        self._evaluations = 0
        self.termination = self._termination()

    # -- the Strategy interface -------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:  # options, name, best_context... of the restart
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def step(self) -> int:
        """Steps of all restarts so far."""
        return self.offset + self.inner.step

    def ask(self) -> list[Perturbation]:
        return self.inner.ask()

    def peek_seeds(self, count: int = 4) -> list[int]:
        return self.inner.peek_seeds(count)

    def plan_budget(self, budget: Any) -> None:
        """Learn the run's budget (a restart that cannot pay one step is not made)."""
        self._budget = budget
        plan = getattr(self.inner, "plan_budget", None)
        if plan is not None:
            plan(budget)

    def tell(self, rewards: Sequence[float] | np.ndarray) -> Update:
        """The wrapped strategy's update; after a terminated restart, the move to a new start."""
        population = len(self.inner.ask())
        update = self.inner.tell(rewards)
        self._evaluations += population
        self.spent[self.regime] += population
        raw = np.asarray(rewards, dtype=np.float64).reshape(-1)
        finite = raw[np.isfinite(raw)]
        if finite.size:
            self.best_reward = max(self.best_reward, float(finite.max()))
        x = getattr(self.space, "vector", None)  # a pool without a driver replica has none
        x_rms = 1.0 if x is None else float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))
        # pycma's own criteria where the strategy has them: its tolfun reads the spread of
        # recent values, not the best so far
        own = getattr(self.inner, "termination_reason", None)
        reason = own() if own is not None else self.termination.check(finite, self._sigma(), x_rms)
        self.metrics = {
            **self.inner.metrics,
            "step": self.step - 1,
            "best_reward": self.best_reward,
            "restart": self.index,
        }
        if reason is None:
            return update
        return self._end_restart(reason, update)

    def _sigma(self) -> float | None:
        """The search scale the tolx criterion reads (None where the strategy has none)."""
        scale = getattr(self.inner, "search_scale", None)
        sigma = scale() if scale is not None else self.inner.current_sigma()
        scales = getattr(self.space, "scales", None)
        if sigma is not None and scales is not None and type(self.inner).adapts_sigma:
            sigma *= float(scales().max())  # SNES: sigma s per coordinate
        return sigma

    def _end_restart(self, reason: str, update: Update) -> Update:
        record = {"restart": self.index, "reason": reason, "steps": self.inner.step,
                  "end_step": self.step, "evaluations": self._evaluations,
                  "population": self.inner.options.population, "regime": self.regime,
                  "best_reward": float(self.best_reward)}  # fmt: skip
        self.restart_log.append(record)
        nxt = self._next_overrides()
        room = None if self._budget is None else self._budget.max_evaluations
        fits = room is None or self._evaluations + nxt["population"] <= room
        limit = self.restart_options.max_restarts
        if self.kind == "stop" or (limit is not None and self.index >= limit) or not fits:
            self.terminated = reason
            return update
        self.index += 1
        self.offset = self.step
        self.overrides = nxt
        self.regime = nxt.pop("regime")
        x0 = self.start(derived_seed(self.seed, self.index, 1))
        self.inner = self._build()
        self.termination = self._termination()
        if self._budget is not None and hasattr(self.inner, "plan_budget"):
            self.inner.plan_budget(_remaining(self._budget, self._evaluations))
        point = tuple(np.asarray(x0, dtype=np.float64).tolist())
        return Update(update.run_seed, update.step, (), 0.0, shift=point, restart=True)

    def _next_overrides(self) -> dict[str, Any]:
        """Population, sigma and rate of the next restart, and its BIPOP regime."""
        p0, factor = self._base["population"], self.restart_options.population_factor
        large = self.large + 1
        if self.kind != "bipop" or self.spent["small"] >= self.spent["large"]:
            return {"population": self._rounded(p0 * factor**large), "regime": "large",
                    "large": large}  # fmt: skip
        rng = np.random.default_rng(derived_seed(self.seed, self.index + 1, 2))
        u, v = rng.random(2)
        population = self._rounded(p0 * (0.5 * factor**self.large) ** (u * u))
        return {"population": population, "sigma_factor": 10.0 ** (-2.0 * v), "regime": "small"}

    def _rounded(self, population: float) -> int:
        m = self._multiple
        return max(m, math.ceil(round(population, 9) / m) * m)

    def _build(self) -> Strategy:
        over = dict(self.overrides)
        self.large = over.pop("large", self.large)
        factor = over.pop("sigma_factor", 1.0)
        options = {"population": over["population"]}
        if factor != 1.0:
            power = type(self.inner).adaptive_rate_power
            options["sigma"] = _scaled(self._base["sigma"], factor)
            if not type(self.inner).adapts_sigma:
                options["learning_rate"] = _scaled(self._base["learning_rate"], factor**power)
        return self.build(derived_seed(self.seed, self.index), **options)

    def _termination(self) -> Termination:
        population = self.inner.options.population
        return Termination(self.restart_options, self.inner.dimension, population)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The wrapped strategy's state (of the restart under way) and ``restarting``."""
        return {
            **self.inner.state_dict(),
            "restarting": {
                "options": dataclasses.asdict(self.restart_options),
                "kind": self.kind,
                "index": self.index,
                "offset": self.offset,
                "large": self.large,
                "spent": dict(self.spent),
                "regime": self.regime,
                "overrides": dict(self.overrides),
                "log": [dict(r) for r in self.restart_log],
                "terminated": self.terminated,
                "best_reward": self.best_reward,
                "evaluations": self._evaluations,
                "termination": self.termination.state_dict(),
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict``; a checkpoint written without restarts is restart 0."""
        if "restarting" not in state:
            self.inner.load_state_dict(state)
            self.best_reward = self.inner.best_reward
            return
        saved = state["restarting"]
        mine = dataclasses.asdict(self.restart_options)
        if saved["options"] != mine or saved["kind"] != self.kind:
            from esbox.errors import ResumeError

            raise ResumeError(
                f"checkpoint restarts {saved['options']!r} ({saved['kind']}) differ from this "
                f"run's {mine!r} ({self.kind})"
            )
        self.index, self.offset = int(saved["index"]), int(saved["offset"])
        self.spent, self.regime = dict(saved["spent"]), saved["regime"]
        self.overrides = dict(saved["overrides"])
        self.restart_log = [dict(r) for r in saved["log"]]
        self.terminated = saved["terminated"]
        self.best_reward = float(saved["best_reward"])
        self._evaluations = int(saved["evaluations"])
        if self.index:
            self.inner = self._build()
        self.large = int(saved["large"])
        self.inner.load_state_dict({k: v for k, v in state.items() if k != "restarting"})
        self.termination = self._termination()
        self.termination.load_state_dict(saved["termination"])


def _remaining(budget: Any, spent: int) -> Any:
    """``budget`` less the evaluations spent (what a restart's nevergrad plans for)."""
    if budget.max_evaluations is None:
        return budget
    return dataclasses.replace(budget, max_evaluations=max(1, budget.max_evaluations - spent))


def restarting(
    build: Build,
    space: Any,
    options: Any,
    *,
    seed: int,
    x0_start: Start | None = None,
    vector: bool | None = None,
) -> Strategy | Restarting:
    """``build(seed)`` wrapped in ``Restarting`` where ``options`` (anything
    ``restart_options`` takes) resolve to a kind other than none; else ``build(seed)`` itself.
    ``x0_start`` draws points in the problem's domain (``start: domain``); ``vector`` says the
    space is a vector (default: it is a ``VectorSpace``)."""
    options = restart_options(options)
    first = build(seed)
    adaptive = getattr(first, "sigma_adaptation", None) is not None or first.adapts_sigma
    kind = resolve_kind(options, space, type(first), vector, adaptive)
    if kind == "none":
        return first
    start_kind = options.start
    if start_kind == "auto":
        start_kind = "domain" if x0_start is not None else "gaussian"
    if start_kind == "domain" and x0_start is None:
        raise ConfigError("restarts.start: domain needs a problem with a domain (a function)")
    if start_kind == "domain":
        return Restarting(build_first(first, build), space, options, seed=seed,
                          start=x0_start, kind=kind)  # fmt: skip
    vector_now = getattr(space, "vector", None)
    if vector_now is None:  # a pool without a driver replica: its actor 0's vector
        vector_now = space.state_dict()["param.0"].double().numpy()
    x0 = np.array(vector_now, dtype=np.float64, copy=True)
    sigma = first.current_sigma() if first.step == 0 else 1.0
    starts: dict[str, Start] = {
        "x0": lambda _seed: x0.copy(),
        "gaussian": gaussian_start(x0, float(sigma)),
    }
    return Restarting(build_first(first, build), space, options, seed=seed,
                      start=starts[start_kind], kind=kind)  # fmt: skip


def build_first(first: Strategy, build: Build) -> Build:
    """``build``, except that its first call returns ``first`` (restart 0, already built)."""
    cached = iter([first])

    def build_once(seed: int, **overrides: Any) -> Strategy:
        return next(cached, None) or build(seed, **overrides)

    return build_once
