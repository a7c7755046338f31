"""Adaptive sigma (the population success rule) and the black-box defaults on vector spaces."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

import esbox
from esbox.adaptation import SigmaAdaptation, SuccessRule
from esbox.defaults import black_box_defaults, default_population
from esbox.errors import ConfigError
from esbox.registry import available_strategies, get_strategy
from esbox.runconfig import resolve
from esbox.space import VectorSpace

ADAPTIVE = {"kind": "adaptive", "initial": 0.5}


def sphere(x: np.ndarray) -> float:
    return float(np.sum(x**2))


def rastrigin(x: np.ndarray) -> float:
    return float(np.sum(x**2 - 10 * np.cos(2 * np.pi * x) + 10))


# -- the rule ---------------------------------------------------------------------------------
def test_sigma_grows_while_populations_improve_and_shrinks_when_they_stall() -> None:
    rising = SigmaAdaptation(SuccessRule(initial=1.0))
    for step in range(5):
        rising.observe(np.arange(8.0) + 100 * step)  # every member beats the last population
    assert rising.sigma > 1.0
    flat = SigmaAdaptation(SuccessRule(initial=1.0))
    for _ in range(5):
        flat.observe(np.arange(8.0))  # the same rewards: half the comparisons are won
    assert flat.sigma < 1.0


def test_one_step_of_the_rule_by_hand() -> None:
    rule = SuccessRule(initial=2.0, target=0.25, smoothing=0.5, damping=2.0)
    adaptation = SigmaAdaptation(rule)
    adaptation.observe(np.array([0.0, 1.0]))
    assert adaptation.sigma == 2.0  # nothing to compare with yet
    adaptation.observe(np.array([2.0, 3.0]))  # ranks of [0, 1, 2, 3]: new ones hold 2 + 3
    z = (5 - 1) / 4 - 0.25
    assert adaptation.success == pytest.approx(0.5 * z)
    assert adaptation.sigma == pytest.approx(2.0 * math.exp(0.5 * z / 2.0))


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"kind": "adaptive", "inital": 1.0}, "initial"),
        ({"kind": "adaptive", "initial": -1.0}, "sigma.initial"),
        ({"kind": "adaptive", "target": 2.0}, "target must be in (0, 1)"),
        ({"kind": "adaptive", "damping": "x"}, "sigma.damping must be a number"),
    ],
)
def test_bad_adaptive_sigma_names_the_key(spec: dict, words: str) -> None:
    with pytest.raises(ConfigError, match="sigma") as info:
        esbox.make_strategy("openai_es", 10, sigma=spec)
    assert words in str(info.value)


@pytest.mark.parametrize("name", sorted(available_strategies()))
def test_learning_rate_follows_the_adapted_sigma(name: str) -> None:
    es = esbox.make_strategy(name, 10, seed=1, population=8, sigma=ADAPTIVE, learning_rate=0.1)
    power = type(es).adaptive_rate_power
    for step in range(6):
        sigma = es.current_sigma()
        members = es.ask()
        assert max(abs(p.scale) for p in members) >= sigma  # CoPES scales by sqrt(K)
        update = es.tell(np.arange(8.0) * (step + 1))
        assert update.learning_rate == pytest.approx(0.1 * (sigma / 0.5) ** power)
        assert es.metrics["sigma"] == sigma
    assert es.current_sigma() != 0.5


@pytest.mark.parametrize("name", sorted(available_strategies()))
def test_adaptive_sigma_resumes_identically_through_json(name: str) -> None:
    def build():
        return esbox.make_strategy(name, 10, seed=3, population=8, sigma=ADAPTIVE)

    rng = np.random.default_rng(0)
    rewards = [rng.normal(size=8) + step for step in range(8)]
    whole = build()
    first = build()
    for step in range(8):
        members = whole.ask()
        expected = whole.tell(rewards[step])
        if step < 4:
            first.ask()
            first.tell(rewards[step])
            continue
        if step == 4:
            resumed = build()
            resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert resumed.ask() == members
        assert resumed.tell(rewards[step]) == expected
        assert resumed.current_sigma() == whole.current_sigma()


def test_adaptive_sigma_round_trips_as_a_config() -> None:
    es = esbox.make_strategy("copes", 10, population=8, sigma=ADAPTIVE)
    saved = es.state_dict()["options"]["sigma"]
    assert saved == {
        "kind": "adaptive",
        "initial": 0.5,
        "target": 0.25,
        "smoothing": 0.3,
        "damping": 1.0,
    }
    again = esbox.make_strategy("copes", 10, population=8, sigma=saved)
    again.load_state_dict(es.state_dict())


# -- black-box defaults -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "given", "dimension", "population"),
    [
        ("openai_es", {}, 200, 20),  # 4 + floor(3 ln 200) = 19 -> even
        ("copes", {}, 200, 24),  # a multiple of 2 K = 8
        ("copes", {"subspaces": 2}, 200, 20),
        ("copes", {"antithetic": False}, 1000, 24),
        ("esopt", {}, 1000, 24),
        ("openai_es", {}, 1, 4),
    ],
)
def test_default_population_grows_with_the_dimension_and_fits_the_strategy(
    name: str, given: dict, dimension: int, population: int
) -> None:
    assert default_population(get_strategy(name), dimension, given) == population
    es = esbox.make_strategy(name, VectorSpace(np.zeros(dimension)), **given)
    assert es.options.population == population


def test_vector_spaces_get_black_box_defaults_and_explicit_options_win() -> None:
    space = VectorSpace(np.zeros(50))
    es = esbox.make_strategy("openai_es", space)
    assert es.sigma_adaptation is not None and es.current_sigma() == 1.0
    assert es.options.learning_rate == pytest.approx(math.sqrt(12))  # centered ranks
    fixed = esbox.make_strategy("openai_es", space, sigma=0.1, population=6)
    assert fixed.sigma_adaptation is None and fixed.options.population == 6
    assert fixed.options.learning_rate == pytest.approx(math.sqrt(12) * 0.01)  # natural rate
    plain = esbox.make_strategy("openai_es", 50)  # a dimension: the strategy's own defaults
    assert plain.sigma_adaptation is None and plain.options.population == 16


def test_esopt_gets_a_reward_weighted_natural_rate() -> None:
    defaults = black_box_defaults(get_strategy("esopt"), 100, {"sigma": 0.2})
    assert defaults["learning_rate"] == pytest.approx(0.2)  # zscore, power 1


def test_a_config_on_a_function_gets_the_black_box_defaults() -> None:
    from esbox.adapters.problems import problem_options

    config = resolve(
        {
            "strategy": "copes",
            "problem": {"kind": "function", "name": "sphere", "dimension": 200},
            "budget": {"max_evaluations": 100},
        },
        problem_options(),
    )
    assert config.options["population"] == 24
    assert config.options["sigma"] == {"kind": "adaptive", "initial": 1.0}
    given = resolve(
        {
            "strategy": "copes",
            "options": {"sigma": 0.3, "population": 8},
            "problem": {"kind": "function", "dimension": 200},
            "budget": {"max_steps": 1},
        },
        problem_options(),
    )
    assert given.options["sigma"] == 0.3 and given.options["population"] == 8


# -- out of the box ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["copes", "openai_es", "esopt"])
def test_defaults_solve_the_200d_sphere(name: str) -> None:
    result = esbox.optimize(sphere, np.full(200, 3.0), strategy=name, budget=20000, seed=0)
    assert sphere(result.x) < 1e-3  # from 1800


@pytest.mark.parametrize("name", ["copes", "openai_es", "esopt"])
def test_defaults_halve_the_1000d_rastrigin(name: str) -> None:
    x0 = np.full(1000, 2.5)
    result = esbox.optimize(rastrigin, x0, strategy=name, budget=20000, seed=0)
    assert rastrigin(result.x) < rastrigin(x0) / 2  # 26250 at the start


def test_copes_on_a_vector_shorter_than_k_gets_one_subspace_a_coordinate() -> None:
    copes = get_strategy("copes")
    assert black_box_defaults(copes, 3, {})["subspaces"] == 3
    assert "subspaces" not in black_box_defaults(copes, 3, {"subspaces": 2})
    assert "subspaces" not in black_box_defaults(copes, 100, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "subspaces exceeds the dimension" warning
        es = esbox.make_strategy("copes", esbox.VectorSpace(np.ones(3)), seed=0)
    assert es.options.subspaces == 3 and es.options.population % 3 == 0
