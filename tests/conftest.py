"""Shared fixtures: one fixture parametrized over the whole strategy registry.

Every strategy registered when the tests start (built-in or from an installed plugin) runs
through the same contract, convergence and golden tests without anyone writing them.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

import esbox
from esbox.strategy import Strategy

settings.register_profile("esbox", deadline=None, max_examples=60, derandomize=True)
settings.load_profile("esbox")

# The registry's strategies, and nevergrad's NGOpt (ng:NAME is a family, not listed one by one).
STRATEGY_NAMES = sorted(esbox.available_strategies()) + (
    ["ng:NGOpt"] if importlib.util.find_spec("nevergrad") else []
)


@pytest.fixture(autouse=True, scope="session")
def deliverable_ctrl_c() -> Iterator[None]:
    """The Ctrl-C tests need SIGINT delivered: a shell that starts pytest in the background
    without job control ignores it, and Python (and every child it starts) then keeps
    ignoring it. Restore Python's own handler for the session; children inherit the default."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# Options every strategy accepts (they are on the shared StrategyOptions), small enough to be
# cheap. A strategy that needs more to build at this size adds an entry to EXTRA_OPTIONS.
BASE_OPTIONS: dict[str, Any] = {"population": 8, "sigma": 0.1, "learning_rate": 0.05}
EXTRA_OPTIONS: dict[str, dict[str, Any]] = {
    "copes": {"subspaces": 2},
    "ng:NGOpt": {"ng_budget": 800},  # NGOpt picks its algorithm by the budget
}


# Natural-gradient strategies read learning_rate as eta_mu (1 by design, not a step size): where
# a test asks for an absolute pace, they get these instead.
NATURAL_RATES: dict[str, dict[str, Any]] = {"snes": {"learning_rate": 1.0}}


def contract_options(name: str, **overrides: Any) -> dict[str, Any]:
    """The options the registry-wide tests build strategy ``name`` with."""
    return {**BASE_OPTIONS, **EXTRA_OPTIONS.get(name, {}), **overrides}


@pytest.fixture(params=STRATEGY_NAMES)
def strategy_name(request: pytest.FixtureRequest) -> str:
    """The name of each registered strategy in turn."""
    return request.param


@pytest.fixture
def natural_rates(strategy_name: str) -> dict[str, Any]:
    """Overrides a test that asks for an absolute pace gives the current strategy."""
    return NATURAL_RATES.get(strategy_name, {})


@pytest.fixture
def build_strategy(strategy_name: str):
    """``build(dimension, seed=0, **overrides)``: the current strategy with contract options."""

    def build(dimension: int = 12, seed: int = 0, **overrides: Any) -> Strategy:
        options = contract_options(strategy_name, **overrides)
        return esbox.make_strategy(strategy_name, dimension, seed=seed, **options)

    return build


@pytest.fixture
def x0() -> np.ndarray:
    """A fixed, seeded starting point in 12 dimensions."""
    return np.random.default_rng(1234).normal(size=12)


_ESCAPES: dict[str, bool] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each sandbox escape attempt as contained (its test passed) or not."""
    if "escape" in report.keywords and (report.when == "call" or report.outcome != "passed"):
        _ESCAPES[report.nodeid] = _ESCAPES.get(report.nodeid, True) and report.outcome == "passed"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The tally the sandbox's done-criterion asks for: ``sandbox escapes contained: N/N``."""
    if _ESCAPES:
        contained = sum(_ESCAPES.values())
        terminalreporter.write_line(f"sandbox escapes contained: {contained}/{len(_ESCAPES)}")


@pytest.fixture(scope="module")
def ray_session(request: pytest.FixtureRequest) -> Iterator[None]:
    """A private 2-CPU Ray for one test module; the workers cannot import the test module, so
    its functions travel to them by value."""
    ray = pytest.importorskip("ray")
    module = sys.modules.get(request.module.__name__)
    if module is not None:
        ray.cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    if module is not None:
        ray.cloudpickle.unregister_pickle_by_value(module)
