"""A whole run from a config: the resolved ``RunConfig``, the built problem, strategy and budget.

This is what ``esbox optimize`` builds before it writes anything, as a public API: a Python user
gets the exact problem a YAML config describes with :func:`load_run`, and can run it with
``session.runner()``. Bad values raise ``ConfigError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esbox.errors import ConfigError, ConfigWarning
from esbox.registry import make_strategy
from esbox.restarts import restarting
from esbox.runconfig import (
    RunConfig,
    ScaleConfig,
    apply_overrides,
    load_yaml,
    resolve,
    vector_dimension,
)
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
    pool: Any = None  # a RayPool with scale.workers: it scores the members, pool.space follows
    resources: ExitStack = field(default_factory=ExitStack)  # the pool and its Ray

    def runner(self, *, callbacks: Sequence[Callback] = (), **options: Any) -> Runner:
        """A ``Runner`` over this session (the problem's callbacks first); ``options`` go to it,
        ``max_nonfinite_steps`` from the config's budget unless given."""
        options.setdefault("max_nonfinite_steps", self.config.budget.max_nonfinite_steps)
        space, evaluator = self.problem.space, self.problem.evaluator
        checks: list[Callback] = []
        if self.pool is not None:
            from esbox.adapters.scale import VerifyReplicas

            space, evaluator = self.pool.space, self.pool
            if self.config.scale.verify_every:
                checks.append(VerifyReplicas(self.pool, self.config.scale.verify_every))
        return Runner(
            space,
            self.strategy,
            evaluator,
            self.budget,
            callbacks=[*self.problem.callbacks, *checks, *callbacks],
            **options,
        )

    def close(self) -> None:
        """Kill the pool's actors and leave (or stop) its Ray; nothing to do without a pool."""
        self.resources.close()


# sections of a config that ``esbox grpo`` reads (GRPO's side of a shared config); ES skips them
RL_SECTIONS = ("grpo", "lora")


def resolve_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw config; the problem section is made independent of the working dir."""
    raw = {key: value for key, value in raw.items() if key not in RL_SECTIONS}
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
    check_scale(config, strategy)
    if config.budget.max_evaluations is not None:
        check_budget_fits(config.budget.max_evaluations, population_of(strategy))


def dry_run(config: RunConfig) -> None:
    """Everything a real run checks, without evaluating: the strategy, its fit with the
    problem and the budget, and the problem and strategy built (kinds that load a model only
    run their checks)."""
    check_strategy(config)
    if builds_on_dry_run(config.problem):  # in this process: a dry run starts no Ray
        build_session(dataclasses.replace(config, scale=ScaleConfig()))


def check_scale(config: RunConfig, strategy: Strategy) -> None:
    """With ``scale.workers``: a valid address, and nothing that lives only on the driver."""
    if not config.scale.workers:
        return
    from esbox.adapters.scale import check_address

    check_address(config.scale.address)
    if getattr(strategy, "contexts", None):
        raise ConfigError(
            f"scale.workers: strategy {config.strategy} co-evolves options.contexts on the "
            f"driver, which the pool's replicas do not see; run it with scale.workers: 0"
        )
    if config.problem.get("agent"):
        raise ConfigError(
            "scale.workers: problem.agent (multi-turn tool use) keeps its metrics in the "
            "driver's evaluator and does not run on a pool yet; run it with scale.workers: 0"
        )


def build_session(config: RunConfig) -> Session:
    """Build the problem, strategy and budget of a resolved config (models load here)."""
    check_strategy(config)
    resources = ExitStack()
    try:
        problem, pool = _problem_and_pool(config, resources)
        strategy = _strategy(config, problem)
        if problem.attach is not None:
            problem.attach(strategy)
    except BaseException:
        resources.close()
        raise
    budget = Budget(**config.budget.limits())
    return Session(config, problem, strategy, budget, pool, resources)


def _strategy(config: RunConfig, problem: Problem) -> Any:
    """The run's strategy, restarting (``config.restarts``) where it runs on a vector."""

    def build(seed: int, **overrides: Any) -> Strategy:
        options = {**config.options, **overrides}
        return make_strategy(config.strategy, problem.space, seed=seed, **options)

    vector = vector_dimension(config.problem, problem_options()) is not None
    return restarting(
        build,
        problem.space,
        config.restarts,
        seed=config.seed,
        x0_start=problem.restart_start,
        vector=vector,
    )


def _problem_and_pool(config: RunConfig, resources: ExitStack) -> tuple[Problem, Any]:
    """The problem, built here; with ``scale.workers`` also a pool of replicas of it on Ray
    (then, without ``scale.driver_replica``, a problem whose space, evaluator and save are the
    pool's)."""
    scale = config.scale
    local = None
    if not scale.workers or scale.driver_replica:
        local = build_problem(config.problem, config.seed)
    if not scale.workers:
        return local, None
    from esbox.adapters.scale.cluster import open_pool

    factory = functools.partial(build_problem, config.problem, config.seed)
    pool = open_pool(scale, factory, local or False, resources)
    if local is None:
        local = Problem(pool.space, pool, pool.label or config.problem["kind"], pool.save)
    return local, pool


def load_run(path: str | Path, overrides: Iterable[str] = ()) -> Session:
    """The session of a YAML run config: ``load_run("examples/llm-arith.yaml").runner().run()``."""
    return build_session(load_config(path, overrides))
