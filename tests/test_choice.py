"""``esbox.optimize(f, x0)`` with no strategy picks one by d and budget (esbox.choice), and the
``cma`` strategy it picks at small d: pycma's own stops drive IPOP restarts, a resume replays
pycma bit-identically."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cma")

import esbox
from esbox.adapters.functions import get_function
from esbox.choice import (
    CMA_MIN_BUDGET,
    FULL_CMA_MAX,
    OPENAI_ES_MIN_BUDGET,
    OPENAI_ES_MIN_DIMENSION,
    SEP_CMA_MAX,
    choose_strategy,
)
from esbox.errors import ConfigError


def test_the_rule_picks_by_dimension_and_budget() -> None:
    assert choose_strategy(10, 20_000, pycma=True)[:2] == ("cma", {})
    assert choose_strategy(10, None, pycma=True)[:2] == ("cma", {})  # no budget: a large one
    assert choose_strategy(10, CMA_MIN_BUDGET * 10 - 1, pycma=True)[0] == "esopt"
    assert choose_strategy(FULL_CMA_MAX, CMA_MIN_BUDGET * FULL_CMA_MAX, pycma=True)[1] == {}
    sep = choose_strategy(FULL_CMA_MAX + 1, 10**7, pycma=True)
    assert sep == ("cma", {"diagonal": True}, "auto: cma (diagonal)")
    assert choose_strategy(SEP_CMA_MAX + 1, 10**9, pycma=True)[0] == "openai_es"
    assert choose_strategy(10, 20_000, pycma=False) == ("esopt", {}, "auto: esopt")
    large = OPENAI_ES_MIN_DIMENSION + 1
    long = OPENAI_ES_MIN_BUDGET * large
    assert choose_strategy(large, long, pycma=True) == ("openai_es", {}, "auto: openai_es")
    assert choose_strategy(large, long - 1, pycma=True)[0] == "esopt"  # a short budget
    assert choose_strategy(OPENAI_ES_MIN_DIMENSION, 10**6, pycma=False)[0] == "esopt"


def test_optimize_without_a_strategy_names_its_pick() -> None:
    sphere = get_function("sphere")
    small = esbox.optimize(sphere, np.full(5, 2.0), budget=5000, seed=0)
    assert small.strategy == "auto: cma" and small.best_value < 1e-10
    short = esbox.optimize(sphere, np.full(50, 2.0), budget=10_000, seed=0)  # < 1000 d
    assert short.strategy == "auto: esopt"
    assert short.best_value < sphere(np.full(50, 2.0))
    named = esbox.optimize(sphere, np.full(5, 2.0), "cma", budget=5000, seed=0)
    assert named.strategy == "cma" and named.best_value == small.best_value  # the same run


def test_pycma_stops_drive_ipop_restarts() -> None:
    rastrigin = get_function("rastrigin")
    x0 = rastrigin.default_x0(5, seed=0)
    result = esbox.optimize(rastrigin, x0, budget=20_000, seed=1)
    assert len(result.restarts) >= 2
    assert {r["reason"] for r in result.restarts} <= {"tolfun", "tolx", "tolstagnation",
            "tolflatfitness", "tolfunhist", "noeffectaxis", "noeffectcoord", "conditioncov",
            "stagnation"}  # fmt: skip
    populations = [r["population"] for r in result.restarts]
    assert populations == [populations[0] * 2**i for i in range(len(populations))]
    assert result.best_value < 2.0  # IPOP-CMA-ES on 5-d Rastrigin


def test_cma_resumes_by_replay_bit_identically(tmp_path) -> None:
    rosenbrock = get_function("rosenbrock")
    x0 = np.linspace(-1.0, 1.0, 8)
    kw = {"seed": 3, "restarts": "none"}
    full = esbox.optimize(rosenbrock, x0, "cma", max_steps=12, **kw)
    esbox.optimize(rosenbrock, x0, "cma", max_steps=5, checkpoint_dir=tmp_path, **kw)
    resumed = esbox.optimize(rosenbrock, x0, "cma", max_steps=12, resume=tmp_path, **kw)
    assert np.array_equal(full.x, resumed.x) and full.best_value == resumed.best_value
    strip = [{k: v for k, v in h.items() if k != "wall_seconds"} for h in full.history]
    assert strip == [{k: v for k, v in h.items() if k != "wall_seconds"} for h in resumed.history]


def test_cma_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ConfigError, match="max_dimension"):
        esbox.make_strategy("cma", 5000)
    with pytest.raises(ConfigError, match="own steps"):
        esbox.make_strategy("cma", 5, optimizer="adam")
