"""Classic black-box benchmark functions to minimize, vectorised over a batch of points.

Every function takes one point of shape (d,) and returns a float, or a batch of shape
(B, d) and returns shape (B,); any d works. Formulas and domains are in docs/functions.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from esbox.errors import close_match_hint

Kernel = Callable[..., np.ndarray]
Shift = np.ndarray | int | None

# Minimiser of 0.5 * (x^4 - 16 x^2 + 5 x): the real root of 4x^3 - 32x + 5 near -2.9.
STYBLINSKI_TANG_ARGMIN = -2.903534027771177
ROTATION_ROUNDS = 3


@dataclass(frozen=True, eq=False)
class BenchmarkFunction:
    """A benchmark f(x) = kernel(x - shift, **params) with a known optimum, to be minimized."""

    name: str
    kernel: Kernel = field(repr=False)
    domain: tuple[float, float]
    optimum_coordinate: float = 0.0
    optimum_value_per_dimension: float = 0.0
    min_dimension: int = 1
    params: Mapping[str, Any] = field(default_factory=dict)
    shift: Shift = field(default=None, repr=False)

    def __call__(self, x: Any) -> float | np.ndarray:
        """Evaluate one point (d,) to a float or a batch (B, d) to an array (B,), in float64."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim not in (1, 2):
            raise ValueError(f"{self.name}: expected shape (d,) or (B, d), got {x.shape}")
        batch = np.atleast_2d(x)
        values = self.kernel(batch - self.shift_vector(batch.shape[1]), **self.params)
        return float(values[0]) if x.ndim == 1 else values

    def shift_vector(self, d: int) -> np.ndarray:
        """The shift in dimension d: zeros, the given vector, or one drawn from the seed."""
        self._check_dimension(d)
        if self.shift is None:
            return np.zeros(d)
        if isinstance(self.shift, (int, np.integer)):
            low, high = self.domain
            margin = 0.1 * (high - low)
            targets = _seeded_uniform(int(self.shift), d, low + margin, high - margin)
            return targets - self.optimum_coordinate
        shift = np.asarray(self.shift, dtype=np.float64)
        if shift.shape != (d,):
            raise ValueError(f"{self.name}: shift has shape {shift.shape}, points have d={d}")
        return shift

    def optimum(self, d: int) -> np.ndarray:
        """The minimiser in dimension d (moved by the shift, if any)."""
        return self.optimum_coordinate + self.shift_vector(d)

    def optimum_value(self, d: int) -> float:
        """The minimum value in dimension d (0 for all but Styblinski-Tang)."""
        self._check_dimension(d)
        return self.optimum_value_per_dimension * d

    def default_x0(self, d: int, seed: int = 0) -> np.ndarray:
        """A seeded uniform random start inside the usual domain."""
        self._check_dimension(d)
        return np.random.default_rng(seed).uniform(*self.domain, size=d)

    def with_options(self, shift: Shift = None, **params: Any) -> BenchmarkFunction:
        """A copy with new params or shift (a vector, or an int seed; None keeps the shift)."""
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            known = sorted(self.params)
            raise ValueError(f"{self.name}: unknown options {unknown}; known: {known}")
        shift = self.shift if shift is None else shift
        return dataclasses.replace(self, params={**self.params, **params}, shift=shift)

    def _check_dimension(self, d: int) -> None:
        """Reject dimensions where the function is undefined or degenerate."""
        if d < self.min_dimension:
            raise ValueError(f"{self.name} needs d >= {self.min_dimension}, got d={d}")


@lru_cache(maxsize=8)
def _seeded_uniform(seed: int, d: int, low: float, high: float) -> np.ndarray:
    """A read-only seeded uniform vector, cached because a seed is reused on every call."""
    vector = np.random.default_rng(seed).uniform(low, high, size=d)
    vector.setflags(write=False)
    return vector


@lru_cache(maxsize=8)
def _rotation_signs(seed: int, d: int) -> np.ndarray:
    """The read-only random sign diagonals, one row per rotation round."""
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(ROTATION_ROUNDS, d))
    signs.setflags(write=False)
    return signs


def _hartley(z: np.ndarray) -> np.ndarray:
    """The orthonormal discrete Hartley transform along the last axis: real, O(d log d)."""
    spectrum = np.fft.fft(z, axis=-1)
    return (spectrum.real - spectrum.imag) / np.sqrt(z.shape[-1])


def rotate(z: np.ndarray, seed: int) -> np.ndarray:
    """Apply a seeded orthogonal map to each row: (Hartley . random signs) three times.

    A dense random rotation costs O(d^2) memory; this structured one (as in structured
    orthogonal random features) needs O(d) memory and O(d log d) time yet mixes every
    coordinate into every other, unlike a product of a few Householder reflections.
    """
    for signs in _rotation_signs(seed, z.shape[-1]):
        z = _hartley(z * signs)
    return z


def _sphere(z: np.ndarray) -> np.ndarray:
    """Sum of squares: the easiest convex, separable, isotropic case."""
    return np.sum(z**2, axis=1)


def _ellipsoid(z: np.ndarray, condition: float) -> np.ndarray:
    """Separable ill-conditioned quadratic, axis scales condition ** (i / (d - 1))."""
    weights = condition ** np.linspace(0.0, 1.0, z.shape[1])
    return (z**2) @ weights


def _rotated_ellipsoid(z: np.ndarray, condition: float, seed: int) -> np.ndarray:
    """The ellipsoid in a seeded rotated basis: non-separable, same spectrum."""
    return _ellipsoid(rotate(z, seed), condition)


def _rosenbrock(z: np.ndarray) -> np.ndarray:
    """The banana valley: non-separable, curved and ill-conditioned."""
    head, tail = z[:, :-1], z[:, 1:]
    return np.sum(100.0 * (tail - head**2) ** 2 + (head - 1.0) ** 2, axis=1)


def _rastrigin(z: np.ndarray) -> np.ndarray:
    """A sphere plus a cosine grid of local minima: separable and highly multimodal."""
    return 10.0 * z.shape[1] + np.sum(z**2 - 10.0 * np.cos(2.0 * np.pi * z), axis=1)


def _ackley(z: np.ndarray) -> np.ndarray:
    """A nearly flat outer region with a deep central funnel and many ripples."""
    radius = np.sqrt(np.mean(z**2, axis=1))
    ripple = np.mean(np.cos(2.0 * np.pi * z), axis=1)
    return -20.0 * np.exp(-0.2 * radius) - np.exp(ripple) + 20.0 + np.e


def _griewank(z: np.ndarray) -> np.ndarray:
    """A wide bowl with a product of cosines coupling the coordinates."""
    scales = np.sqrt(np.arange(1, z.shape[1] + 1))
    return 1.0 + np.sum(z**2, axis=1) / 4000.0 - np.prod(np.cos(z / scales), axis=1)


def _levy(z: np.ndarray) -> np.ndarray:
    """Multimodal with sine terms coupling neighbours through w = 1 + (x - 1) / 4."""
    w = 1.0 + (z - 1.0) / 4.0
    head, last = w[:, :-1], w[:, -1]
    first = np.sin(np.pi * w[:, 0]) ** 2
    middle = np.sum((head - 1.0) ** 2 * (1.0 + 10.0 * np.sin(np.pi * head + 1.0) ** 2), axis=1)
    end = (last - 1.0) ** 2 * (1.0 + np.sin(2.0 * np.pi * last) ** 2)
    return first + middle + end


def _styblinski_tang(z: np.ndarray) -> np.ndarray:
    """Separable quartic with its global minimum in a corner basin near x_i = -2.9."""
    return 0.5 * np.sum(z**4 - 16.0 * z**2 + 5.0 * z, axis=1)


_ST_MIN = float(_styblinski_tang(np.array([[STYBLINSKI_TANG_ARGMIN]]))[0])

FUNCTIONS: dict[str, BenchmarkFunction] = {
    f.name: f
    for f in [
        BenchmarkFunction("sphere", _sphere, (-5.12, 5.12)),
        BenchmarkFunction("ellipsoid", _ellipsoid, (-5.0, 5.0), params={"condition": 1e6}),
        BenchmarkFunction(
            "rotated_ellipsoid",
            _rotated_ellipsoid,
            (-5.0, 5.0),
            params={"condition": 1e6, "seed": 0},
        ),
        BenchmarkFunction(
            "rosenbrock", _rosenbrock, (-5.0, 10.0), optimum_coordinate=1.0, min_dimension=2
        ),
        BenchmarkFunction("rastrigin", _rastrigin, (-5.12, 5.12)),
        BenchmarkFunction("ackley", _ackley, (-32.768, 32.768)),
        BenchmarkFunction("griewank", _griewank, (-600.0, 600.0)),
        BenchmarkFunction("levy", _levy, (-10.0, 10.0), optimum_coordinate=1.0),
        BenchmarkFunction(
            "styblinski_tang",
            _styblinski_tang,
            (-5.0, 5.0),
            optimum_coordinate=STYBLINSKI_TANG_ARGMIN,
            optimum_value_per_dimension=_ST_MIN,
        ),
    ]
}


def get_function(name: str, *, shift: Shift = None, **params: Any) -> BenchmarkFunction:
    """Look a benchmark up by name, optionally shifted (f(x - shift)) or re-parametrised."""
    if name not in FUNCTIONS:
        hint = close_match_hint(str(name), FUNCTIONS)
        known = ", ".join(FUNCTIONS)
        raise ValueError(f"unknown benchmark function {name!r}{hint} (known: {known})")
    return FUNCTIONS[name].with_options(shift=shift, **params)


# Alias that reads better where a shifted or re-parametrised function is being built.
make_function = get_function
