"""A whole run from a config: the resolved ``RunConfig``, the built problem, strategy and budget.

This is what ``esbox optimize`` builds before it writes anything, as a public API: a Python user
gets the exact problem a YAML config describes with :func:`load_run`, and can run it with
``session.runner()``. Bad values raise ``ConfigError`` naming the key.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from esbox.errors import ConfigWarning
from esbox.registry import make_strategy
from esbox.runconfig import RunConfig, apply_overrides, load_yaml, resolve
from esbox.runner import Budget, Callback, Runner, check_budget_fits, population_of
from esbox.strategy import Strategy

from .registry import (
    Problem,
    build_problem,
    builds_on_dry_run,
    check_problem,
    normalize_problem,
    problem_options,
)


@dataclass
class Session:
    """Everything a run needs, built and checked before any file is written."""

    config: RunConfig
    problem: Problem
    strategy: Strategy
    budget: Budget

    def runner(self, *, callbacks: Sequence[Callback] = (), **options: Any) -> Runner:
        """A ``Runner`` over this session (the problem's callbacks first); ``options`` go to it."""
        return Runner(
            self.problem.space,
            self.strategy,
            self.problem.evaluator,
            self.budget,
            callbacks=[*self.problem.callbacks, *callbacks],
            **options,
        )


def resolve_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw config; the problem section is made independent of the working dir."""
    config = resolve(raw, problem_options())
    config.problem = normalize_problem(config.problem)
    return config


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> RunConfig:
    """The resolved config of a YAML file, with ``a.b=value`` overrides applied first."""
    return resolve_config(apply_overrides(load_yaml(path), overrides))


def check_strategy(config: RunConfig) -> None:
    """Build the strategy on a 1-d placeholder: catches bad option combinations cheaply, and
    an evaluation budget too small for one step."""
    with warnings.catch_warnings():  # warnings about the dimension wait for the real one
        warnings.simplefilter("ignore", ConfigWarning)
        strategy = make_strategy(config.strategy, 1, seed=config.seed, **config.options)
    check_problem(config.problem, strategy)
    if config.budget.max_evaluations is not None:
        check_budget_fits(config.budget.max_evaluations, population_of(strategy))


def dry_run(config: RunConfig) -> None:
    """Everything a real run checks, without evaluating: the strategy, its fit with the
    problem and the budget, and the problem and strategy built (kinds that load a model only
    run their checks)."""
    if builds_on_dry_run(config.problem):
        build_session(config)
    else:
        check_strategy(config)


def build_session(config: RunConfig) -> Session:
    """Build the problem, strategy and budget of a resolved config (models load here)."""
    check_strategy(config)
    problem = build_problem(config.problem, config.seed)
    strategy = make_strategy(config.strategy, problem.space, seed=config.seed, **config.options)
    if problem.attach is not None:
        problem.attach(strategy)
    return Session(config, problem, strategy, Budget(**asdict(config.budget)))


def load_run(path: str | Path, overrides: Iterable[str] = ()) -> Session:
    """The session of a YAML run config: ``load_run("examples/llm-arith.yaml").runner().run()``."""
    return build_session(load_config(path, overrides))
