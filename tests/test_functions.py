"""Tests for the benchmark functions: optima, batching, shifts, rotation, and cross-checks."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from nevergrad.functions import corefuncs

try:
    from esbox.adapters import functions as fn
except ModuleNotFoundError:  # the package is not installed yet: load the module by path
    _path = Path(__file__).resolve().parents[1] / "adapters" / "functions.py"
    _spec = importlib.util.spec_from_file_location("esbox_adapters_functions", _path)
    fn = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = fn
    _spec.loader.exec_module(fn)

NAMES = sorted(fn.FUNCTIONS)
FAST = settings(max_examples=40, deadline=None)


def points(f: fn.BenchmarkFunction, d: int, batch: int | None = None) -> st.SearchStrategy:
    """Hypothesis arrays of shape (d,) or (batch, d) inside f's domain."""
    low, high = f.domain
    shape = (d,) if batch is None else (batch, d)
    return hnp.arrays(np.float64, shape, elements=st.floats(low, high))


def test_registry_names() -> None:
    assert set(NAMES) == {
        "sphere",
        "ellipsoid",
        "rotated_ellipsoid",
        "rosenbrock",
        "rastrigin",
        "ackley",
        "griewank",
        "levy",
        "styblinski_tang",
    }
    assert all(f.name == name for name, f in fn.FUNCTIONS.items())


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown benchmark.*rastrigin"):
        fn.get_function("rastrigine")


def test_unknown_option_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"unknown options.*condition"):
        fn.get_function("sphere", condition=10.0)


def test_make_function_is_get_function() -> None:
    assert fn.make_function is fn.get_function


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("d", [2, 3, 10, 100])
@pytest.mark.parametrize("shift", [None, 7, "vector"])
def test_value_at_optimum(name: str, d: int, shift: object) -> None:
    if shift == "vector":
        shift = np.random.default_rng(d).normal(size=d)
    f = fn.get_function(name, shift=shift)
    assert f(f.optimum(d)) == pytest.approx(f.optimum_value(d), abs=1e-9)


def test_known_optimum_values() -> None:
    st_fn = fn.FUNCTIONS["styblinski_tang"]
    assert st_fn.optimum_value(5) == pytest.approx(-39.16616570377142 * 5, rel=1e-14)
    assert all(fn.FUNCTIONS[n].optimum_value(5) == 0.0 for n in NAMES if n != "styblinski_tang")
    np.testing.assert_array_equal(fn.FUNCTIONS["rosenbrock"].optimum(3), np.ones(3))
    np.testing.assert_array_equal(fn.FUNCTIONS["levy"].optimum(3), np.ones(3))


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.data())
def test_no_point_beats_the_optimum(name: str, data: st.DataObject) -> None:
    f = fn.FUNCTIONS[name]
    d = data.draw(st.integers(2, 8))
    x = data.draw(points(f, d))
    assert f(x) >= f.optimum_value(d) - 1e-9


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.data())
def test_batch_equals_rows(name: str, data: st.DataObject) -> None:
    f = fn.FUNCTIONS[name]
    d = data.draw(st.integers(2, 12))
    xs = data.draw(points(f, d, batch=data.draw(st.integers(1, 6))))
    values = f(xs)
    assert isinstance(values, np.ndarray)
    assert values.shape == (len(xs),) and values.dtype == np.float64
    rows = [f(x) for x in xs]
    assert all(isinstance(v, float) for v in rows)
    np.testing.assert_allclose(values, rows, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_float32_and_torch_inputs_compute_in_float64(name: str) -> None:
    f = fn.FUNCTIONS[name]
    x32 = np.random.default_rng(0).uniform(*f.domain, size=(4, 6)).astype(np.float32)
    expected = f(x32.astype(np.float64))
    np.testing.assert_array_equal(f(x32), expected)
    np.testing.assert_array_equal(f(torch.from_numpy(x32)), expected)
    assert f(torch.from_numpy(x32[0])) == pytest.approx(expected[0], rel=1e-12)


@pytest.mark.parametrize("bad", [np.float64(1.0), np.zeros((2, 2, 2))])
def test_bad_shape_is_rejected(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="expected shape"):
        fn.FUNCTIONS["sphere"](bad)


def test_rosenbrock_needs_two_dimensions() -> None:
    with pytest.raises(ValueError, match="d >= 2"):
        fn.FUNCTIONS["rosenbrock"](np.zeros(1))


@pytest.mark.parametrize("name", NAMES)
def test_default_x0_is_seeded_and_inside_domain(name: str) -> None:
    f = fn.FUNCTIONS[name]
    x0 = f.default_x0(50, seed=3)
    assert x0.shape == (50,)
    assert np.all((x0 >= f.domain[0]) & (x0 <= f.domain[1]))
    np.testing.assert_array_equal(x0, f.default_x0(50, seed=3))
    assert not np.array_equal(x0, f.default_x0(50, seed=4))


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(data=st.data())
def test_vector_shift_moves_the_function(name: str, data: st.DataObject) -> None:
    base = fn.FUNCTIONS[name]
    d = data.draw(st.integers(2, 8))
    shift = data.draw(hnp.arrays(np.float64, d, elements=st.floats(-3, 3)))
    x = data.draw(points(base, d))
    shifted = fn.make_function(name, shift=shift)
    assert shifted(x + shift) == pytest.approx(base(x), rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(shifted.optimum(d), base.optimum(d) + shift)


@pytest.mark.parametrize("name", NAMES)
def test_seeded_shift_keeps_optimum_inside_domain(name: str) -> None:
    f = fn.get_function(name, shift=11)
    low, high = f.domain
    optimum = f.optimum(1000)
    assert np.all((optimum > low) & (optimum < high))
    assert not np.allclose(optimum, fn.FUNCTIONS[name].optimum(1000))
    np.testing.assert_array_equal(optimum, fn.get_function(name, shift=11).optimum(1000))
    assert not np.array_equal(optimum, fn.get_function(name, shift=12).optimum(1000))


def test_with_options_keeps_the_shift() -> None:
    shifted = fn.get_function("ellipsoid", shift=4)
    changed = shifted.with_options(condition=10.0)
    np.testing.assert_array_equal(changed.optimum(5), shifted.optimum(5))
    assert changed.params == {"condition": 10.0}
    assert fn.FUNCTIONS["ellipsoid"].params == {"condition": 1e6}


def test_shift_of_wrong_length_is_rejected() -> None:
    with pytest.raises(ValueError, match="shift has shape"):
        fn.get_function("sphere", shift=np.zeros(3))(np.zeros(4))


@pytest.mark.parametrize("d", [1, 2, 3, 17, 64])
def test_rotation_is_orthogonal(d: int) -> None:
    q = fn.rotate(np.eye(d), seed=5)
    np.testing.assert_allclose(q @ q.T, np.eye(d), atol=1e-12)


def test_rotation_mixes_every_coordinate() -> None:
    # No axis stays nearly fixed (a few Householder reflections would leave entries near 1).
    q = fn.rotate(np.eye(256), seed=0)
    assert np.abs(q).max() < 0.4
    assert not np.allclose(q, fn.rotate(np.eye(256), seed=1))


@FAST
@given(
    z=hnp.arrays(
        np.float64, st.tuples(st.integers(1, 5), st.integers(1, 40)), elements=st.floats(-10, 10)
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_rotation_preserves_norms(z: np.ndarray, seed: int) -> None:
    rotated = fn.rotate(z, seed)
    np.testing.assert_allclose(
        np.linalg.norm(rotated, axis=1), np.linalg.norm(z, axis=1), rtol=1e-12, atol=1e-12
    )


@FAST
@given(
    x=hnp.arrays(
        np.float64, st.tuples(st.integers(1, 4), st.integers(1, 30)), elements=st.floats(-5, 5)
    ),
    seed=st.integers(0, 100),
)
def test_rotated_ellipsoid_with_condition_one_is_sphere(x: np.ndarray, seed: int) -> None:
    f = fn.get_function("rotated_ellipsoid", condition=1.0, seed=seed)
    np.testing.assert_allclose(f(x), fn.FUNCTIONS["sphere"](x), rtol=1e-12, atol=1e-12)


def test_rotated_ellipsoid_is_not_separable_but_keeps_the_spectrum() -> None:
    d = 20
    rotated, plain = fn.FUNCTIONS["rotated_ellipsoid"], fn.FUNCTIONS["ellipsoid"]
    axes = np.eye(d)
    assert not np.allclose(rotated(axes), plain(axes))
    # The inverse rotation of axis i (rows of the transposed matrix) hits weight i exactly.
    eigen_directions = fn.rotate(np.eye(d), seed=0).T
    np.testing.assert_allclose(rotated(eigen_directions), plain(axes), rtol=1e-9)


def test_rotated_ellipsoid_scales_to_a_million_dimensions() -> None:
    f = fn.FUNCTIONS["rotated_ellipsoid"]
    d = 1_000_000
    assert f(f.optimum(d)) == 0.0
    assert f(np.full(d, 1e-3)) > 0.0


# nevergrad's corefuncs as the independent reference. Conventions that differ:
#   styblinski_tang = st0 - 39.16599 * d  (st0 adds a positive offset so values are >= 0).
# The rest match after nothing more than the name: ellipsoid weights 10 ** linspace(0, 6, d)
# are our default condition 1e6, and every other formula and constant is the same.
NEVERGRAD = {
    "sphere": lambda x: corefuncs.sphere(x),
    "ellipsoid": lambda x: corefuncs.ellipsoid(x),
    "rosenbrock": lambda x: corefuncs.rosenbrock(x),
    "rastrigin": lambda x: corefuncs.rastrigin(x),
    "ackley": lambda x: corefuncs.ackley(x),
    "griewank": lambda x: corefuncs.griewank(x),
    "styblinski_tang": lambda x: corefuncs.st0(x) - 39.16599 * len(x),
}


@pytest.mark.parametrize("name", sorted(NEVERGRAD))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_matches_nevergrad(name: str, data: st.DataObject) -> None:
    f = fn.FUNCTIONS[name]
    d = data.draw(st.integers(2, 30))
    x = data.draw(points(f, d))
    assert f(x) == pytest.approx(NEVERGRAD[name](x), rel=1e-10, abs=1e-10)


def levy_textbook(x: list[float]) -> float:
    """Levy function exactly as written in Surjanovic & Bingham's library, one term at a time."""
    w = [1 + (xi - 1) / 4 for xi in x]
    total = math.sin(math.pi * w[0]) ** 2
    for wi in w[:-1]:
        total += (wi - 1) ** 2 * (1 + 10 * math.sin(math.pi * wi + 1) ** 2)
    return total + (w[-1] - 1) ** 2 * (1 + math.sin(2 * math.pi * w[-1]) ** 2)


@FAST
@given(data=st.data())
def test_levy_matches_textbook_formula(data: st.DataObject) -> None:
    f = fn.FUNCTIONS["levy"]
    x = data.draw(points(f, data.draw(st.integers(1, 30))))
    assert f(x) == pytest.approx(levy_textbook(list(x)), rel=1e-10, abs=1e-10)
