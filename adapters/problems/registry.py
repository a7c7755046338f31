"""Problem kinds of the run config: ``problem.kind`` -> options dataclass + factory.

A factory turns the resolved options and the run seed into a ``Problem``: the parameter space,
the evaluator, a label, and a ``save`` hook writing the best parameters into the run
directory. Adding a kind (e.g. ``llm``) is one options dataclass and one function decorated
with ``@problem_kind``; heavy imports belong inside the factory. A kind may also ``check`` its
section against the strategy (cheaply, before anything loads), and a Problem may ``attach``
itself to the built strategy (e.g. to read the strategy's current contexts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esbox.errors import ConfigError
from esbox.evaluation import Evaluator
from esbox.space import ParameterSpace
from esbox.strategy import Strategy


@dataclass
class Problem:
    """What one run optimizes."""

    space: ParameterSpace
    evaluator: Evaluator
    label: str
    save: Callable[[Path], dict[str, Any]]  # writes best parameters; returns summary fields
    callbacks: list[Callable[..., Any]] = field(default_factory=list)  # run before the logger
    attach: Callable[[Strategy], None] | None = None  # connects it to the built strategy
    start: Callable[[Path], None] | None = None  # told the run directory before the run starts
    restart_start: Callable[[int], Any] | None = None  # seed -> a point in the domain (restarts)


@dataclass(frozen=True)
class ProblemKind:
    """A registered ``problem.kind``."""

    name: str
    options: type
    build: Callable[[Any, int], Problem]
    help: str
    normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    check: Callable[[dict[str, Any], Strategy], None] | None = None
    dry_run: bool = True  # ``--dry-run`` builds it (false where building loads a model)


PROBLEM_KINDS: dict[str, ProblemKind] = {}


def problem_kind(
    name: str,
    options: type,
    help: str,
    normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    check: Callable[[dict[str, Any], Strategy], None] | None = None,
    dry_run: bool = True,
) -> Callable[[Callable[[Any, int], Problem]], Callable[[Any, int], Problem]]:
    """Register ``build(options, seed) -> Problem`` as ``problem.kind: name``."""

    def decorate(build: Callable[[Any, int], Problem]) -> Callable[[Any, int], Problem]:
        if name in PROBLEM_KINDS:
            raise ValueError(f"problem kind '{name}' is already registered")
        PROBLEM_KINDS[name] = ProblemKind(name, options, build, help, normalize, check, dry_run)
        return build

    return decorate


def problem_options() -> dict[str, type]:
    """The options dataclass of every problem kind (for ``esbox.runconfig.resolve``)."""
    return {name: kind.options for name, kind in PROBLEM_KINDS.items()}


def normalize_problem(problem: dict[str, Any]) -> dict[str, Any]:
    """A resolved problem section made independent of the working directory."""
    kind = PROBLEM_KINDS[problem["kind"]]
    return kind.normalize(dict(problem)) if kind.normalize else dict(problem)


def check_problem(problem: dict[str, Any], strategy: Strategy) -> None:
    """Check a resolved problem section against the strategy; ConfigError names the key."""
    kind = PROBLEM_KINDS[problem["kind"]]
    if kind.check:
        kind.check(problem, strategy)


def builds_on_dry_run(problem: dict[str, Any]) -> bool:
    """Whether ``--dry-run`` builds this problem (cheap kinds) or only checks it."""
    return PROBLEM_KINDS[problem["kind"]].dry_run


def build_problem(problem: dict[str, Any], seed: int) -> Problem:
    """The Problem of a resolved problem section; bad values raise ConfigError."""
    kind = PROBLEM_KINDS[problem["kind"]]
    options = kind.options(**{k: v for k, v in problem.items() if k != "kind"})
    try:
        return kind.build(options, seed)
    except ConfigError:
        raise
    except (ValueError, OverflowError) as exc:
        raise ConfigError(f"problem: {exc}") from None
    except MemoryError:
        raise ConfigError(
            "problem: not enough memory to build it (is the dimension too large?)"
        ) from None
