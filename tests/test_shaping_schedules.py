"""Reward shaping invariances, the bad-reward rule, and schedules indexed by step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import esbox
from esbox.errors import ConfigError
from esbox.schedules import Constant, Cosine, Linear, make_schedule, schedule_to_config
from esbox.shaping import centered_ranks, sanitize, shape, zscore

rewards = hnp.arrays(
    np.float64,
    st.integers(2, 40),
    elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
)
tied_rewards = hnp.arrays(np.float64, st.integers(2, 40), elements=st.integers(-5, 5).map(float))


# -- z-score ------------------------------------------------------------------------------------
@given(rewards, st.floats(-1e3, 1e3))
def test_zscore_is_invariant_to_adding_a_constant(r, c) -> None:
    assume(r.std() > 1e-3)
    np.testing.assert_allclose(zscore(r + c), zscore(r), atol=1e-7)


@given(rewards, st.floats(1e-3, 1e3))
def test_zscore_is_invariant_to_positive_scaling(r, a) -> None:
    assume(r.std() > 1e-3)
    np.testing.assert_allclose(zscore(a * r), zscore(r), atol=1e-7)


@given(rewards)
def test_zscore_has_mean_zero_and_std_one(r) -> None:
    assume(r.std() > 1e-3)
    z = zscore(r)
    assert abs(z.mean()) < 1e-9
    assert abs(z.std() - 1.0) < 1e-9


@given(rewards)
def test_zscore_flips_under_negation(r) -> None:
    """Maximizing -f is minimizing f: the sign must follow, not be absorbed."""
    assume(r.std() > 1e-3)
    np.testing.assert_allclose(zscore(-r), -zscore(r), atol=1e-9)


# -- centered ranks ------------------------------------------------------------------------------
def increasing_map(values: np.ndarray, steps: np.ndarray, start: float) -> np.ndarray:
    """An arbitrary strictly increasing transform: the k-th distinct value goes to start + sum."""
    distinct = np.unique(values)
    targets = start + np.cumsum(steps[: distinct.size])
    return targets[np.searchsorted(distinct, values)]


@given(
    tied_rewards | rewards,
    hnp.arrays(np.float64, 40, elements=st.floats(1e-3, 1e3)),
    st.floats(-1e6, 1e6),
)
def test_centered_ranks_invariant_to_any_strictly_increasing_transform(r, steps, start) -> None:
    transformed = increasing_map(r, steps, start)
    np.testing.assert_array_equal(centered_ranks(transformed), centered_ranks(r))


@given(tied_rewards | rewards)
def test_centered_ranks_invariant_to_common_monotone_maps(r) -> None:
    expected = centered_ranks(r)
    for f in (np.exp, lambda x: x**3 + x, lambda x: 5 * x - 2, np.arctan):
        y = f(r / 1e3)
        assume(np.unique(y).size == np.unique(r).size)  # the map kept all values distinct
        np.testing.assert_array_equal(centered_ranks(y), expected)


@given(tied_rewards | rewards)
def test_centered_ranks_are_centered_in_half_unit_range(r) -> None:
    ranks = centered_ranks(r)
    assert abs(ranks.sum()) < 1e-9
    assert ranks.min() >= -0.5 and ranks.max() <= 0.5
    order = np.argsort(r, kind="stable")
    assert np.all(np.diff(ranks[order]) >= 0)  # monotone in the reward
    for value in np.unique(r):  # ties share one rank
        assert np.unique(ranks[r == value]).size == 1


def test_centered_ranks_known_values() -> None:
    np.testing.assert_allclose(centered_ranks(np.array([3.0, 1.0, 2.0])), [0.5, -0.5, 0.0])
    np.testing.assert_allclose(
        centered_ranks(np.array([1.0, 5.0, 5.0, 9.0])), [-0.5, 0.0, 0.0, 0.5]
    )


@given(tied_rewards | rewards, st.randoms(use_true_random=False))
def test_shaping_is_permutation_equivariant(r, rnd) -> None:
    perm = np.array(rnd.sample(range(r.size), r.size))
    for method in ("centered_ranks", "zscore"):
        np.testing.assert_allclose(shape(r[perm], method), shape(r, method)[perm], atol=1e-12)


# -- degenerate and bad rewards -----------------------------------------------------------------
@pytest.mark.parametrize("method", ["centered_ranks", "zscore", "raw"])
@pytest.mark.parametrize("n", [1, 2, 9])
def test_all_equal_rewards_shape_to_zeros(method: str, n: int) -> None:
    out = shape(np.full(n, 3.25), method)
    assert np.all(out == 0.0)
    assert np.all(np.isfinite(out))


def test_sanitize_replaces_nonfinite_rewards_by_the_worst_finite_one() -> None:
    clean, bad = sanitize([1.0, np.nan, 4.0, np.inf, -2.0, -np.inf])
    assert bad == 3
    np.testing.assert_array_equal(clean, [1.0, -2.0, 4.0, -2.0, -2.0, -2.0])


def test_plus_infinity_is_a_failure_not_a_winner() -> None:
    clean, _ = sanitize([0.0, 1.0, np.inf])
    ranks = centered_ranks(clean)
    assert ranks[2] == ranks.min()


def test_all_nonfinite_rewards_become_zeros() -> None:
    clean, bad = sanitize([np.nan, np.inf, -np.inf])
    assert bad == 3
    assert np.all(clean == 0.0)
    assert np.all(shape(clean, "zscore") == 0.0)


def test_sanitize_does_not_modify_its_input() -> None:
    r = np.array([np.nan, 1.0])
    sanitize(r)
    assert np.isnan(r[0])


@given(
    hnp.arrays(
        np.float64,
        st.integers(1, 30),
        elements=st.one_of(st.floats(-1e6, 1e6), st.sampled_from([np.nan, np.inf, -np.inf])),
    )
)
def test_shaped_rewards_are_always_finite(r) -> None:
    clean, _ = sanitize(r)
    for method in ("centered_ranks", "zscore"):
        assert np.all(np.isfinite(shape(clean, method)))


def test_grouped_shaping_standardizes_each_group() -> None:
    r = np.array([1.0, 2.0, 3.0, 100.0, 200.0, 300.0])
    groups = np.array([0, 0, 0, 1, 1, 1])
    z = shape(r, "zscore", groups)
    np.testing.assert_allclose(z[:3], z[3:])
    for g in (0, 1):
        assert abs(z[groups == g].mean()) < 1e-12
        assert abs(z[groups == g].std() - 1) < 1e-12
    joint = shape(r, "zscore")
    assert not np.allclose(joint, z)


def test_unknown_shaping_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="centered_ranks"):
        shape(np.zeros(3), "softmax")


# -- schedules ----------------------------------------------------------------------------------
def test_constant_schedule() -> None:
    s = Constant(0.3)
    assert [s(t) for t in (0, 1, 10**6)] == [0.3, 0.3, 0.3]


def test_linear_schedule_endpoints_and_midpoint() -> None:
    s = Linear(start=1.0, end=0.0, steps=10)
    assert s(0) == 1.0
    assert s(5) == pytest.approx(0.5)
    assert s(10) == 0.0
    assert s(1000) == 0.0
    values = [s(t) for t in range(12)]
    assert np.all(np.diff(values) <= 0)


@given(
    st.floats(1e-4, 10),
    st.floats(0, 1),
    st.integers(1, 1000),
    st.integers(0, 1200),
)
def test_cosine_schedule_is_the_esopt_formula(sigma0, ratio, horizon, t) -> None:
    sigma_min = sigma0 * ratio
    s = Cosine(start=sigma0, end=sigma_min, steps=horizon)
    tt = min(t, horizon)
    expected = sigma_min + 0.5 * (sigma0 - sigma_min) * (1 + math.cos(math.pi * tt / horizon))
    assert s(t) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert sigma_min - 1e-12 <= s(t) <= sigma0 + 1e-12


def test_cosine_known_points() -> None:
    s = Cosine(start=1.0, end=0.2, steps=100)
    assert s(0) == 1.0
    assert s(50) == pytest.approx(0.6)
    assert s(100) == pytest.approx(0.2)
    assert s(500) == pytest.approx(0.2)


@pytest.mark.parametrize("cls", [Linear, Cosine])
def test_warmup_ramps_up_then_anneals_from_start(cls) -> None:
    s = cls(start=1.0, end=0.1, steps=20, warmup=4)
    assert [s(t) for t in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert s(4) == 1.0
    assert s(20) == pytest.approx(0.1)
    assert s(12) == pytest.approx(cls(start=1.0, end=0.1, steps=16)(8))


def test_make_schedule_from_numbers_dicts_and_schedules() -> None:
    assert make_schedule(0.5) == Constant(0.5)
    assert make_schedule(2) == Constant(2.0)
    cos = make_schedule({"kind": "cosine", "start": 1.0, "end": 0.1, "steps": 10})
    assert cos == Cosine(1.0, 0.1, 10)
    assert make_schedule(cos) is cos
    assert make_schedule({"value": 0.3}) == Constant(0.3)


@pytest.mark.parametrize(
    "schedule",
    [Constant(0.4), Linear(1.0, 0.5, 30, 3), Cosine(0.2, 0.0, 7)],
    ids=["constant", "linear", "cosine"],
)
def test_schedule_config_round_trip(schedule) -> None:
    assert make_schedule(schedule_to_config(schedule)) == schedule


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"kind": "exponential", "start": 1.0}, "constant, linear, cosine"),
        ({"kind": "linear", "start": 1.0}, "bad options"),
        ({"kind": "linear", "start": 1.0, "end": 0.0, "steps": 0}, "steps"),
        ({"kind": "cosine", "start": 1.0, "end": 0.0, "steps": 5, "warmup": -1}, "warmup"),
        (-0.1, ">= 0"),
        (float("nan"), "finite"),
        ({"kind": "cosine", "start": -1.0, "end": 0.0, "steps": 5}, ">= 0"),
        ("0.1", "number"),
        (True, "number"),
    ],
)
def test_bad_schedules_are_config_errors(spec, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_schedule(spec, "sigma")


# -- step t uses schedule(t) --------------------------------------------------------------------
def test_step_t_uses_schedule_of_t() -> None:
    """The evosax off-by-one guard: ask/tell at step t see sigma(t) and learning_rate(t)."""
    sigma = {"kind": "linear", "start": 0.5, "end": 0.05, "steps": 6}
    lr = {"kind": "cosine", "start": 0.2, "end": 0.01, "steps": 6, "warmup": 2}
    es = esbox.make_strategy("openai_es", 5, population=4, sigma=sigma, learning_rate=lr)
    s, a = make_schedule(sigma), make_schedule(lr)
    rng = np.random.default_rng(0)
    for t in range(8):
        assert es.step == t
        members = es.ask()
        assert {abs(p.scale) for p in members} == {s(t)}
        assert all(p.step == t for p in members)
        update = es.tell(rng.normal(size=4))
        assert update.step == t
        assert update.learning_rate == a(t)
        assert es.metrics["sigma"] == s(t)
        assert es.metrics["learning_rate"] == a(t)
