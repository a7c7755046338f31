"""SNES: NES utilities, the space's per-coordinate scales, and the strategy end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import esbox
from esbox.defaults import black_box_defaults
from esbox.registry import get_strategy, make_strategy
from esbox.shaping import shape, utilities
from esbox.space import VectorSpace
from esbox.specs import Perturbation, Term, Update

D = 12


def _noise(space: VectorSpace, perturbation: Perturbation) -> torch.Tensor:
    return torch.cat([values for _, values in space.noise(perturbation)])


def test_utilities_sum_to_zero_and_only_the_better_half_pulls() -> None:
    u = utilities(np.array([3.0, -1.0, 7.0, 0.5, 2.0, 10.0]))
    assert u.sum() == pytest.approx(0.0, abs=1e-12)
    order = np.argsort([3.0, -1.0, 7.0, 0.5, 2.0, 10.0])
    assert np.all(np.diff(u[order]) >= 0)  # monotone in the reward
    assert u[5] > u[2] > 0 > u[0] > u[1]  # the best two push; the worse half gets -1/n
    assert u[1] == u[3] == u[4] == pytest.approx(-1 / 6)


def test_tied_rewards_share_their_utility_and_shape_knows_utilities() -> None:
    u = utilities(np.array([1.0, 5.0, 5.0, 0.0]))
    assert u[1] == u[2] and u[1] > u[0]
    assert np.array_equal(shape(np.array([1.0, 5.0, 5.0, 0.0]), "utilities"), u)
    assert np.all(utilities(np.full(4, 2.0)) == 0)


def test_a_diagonal_member_is_sigma_times_the_scales_times_eps() -> None:
    space = VectorSpace(np.zeros(D))
    move = Update(0, 0, (), 1.0, scale_terms=(Term(7, 0.3), Term(8, -0.2)))
    space.apply(move)
    s = space.scales()
    assert not torch.allclose(s, torch.ones(D))
    plain = _noise(space, Perturbation(0, 1, 5, 0.5))
    diagonal = _noise(space, Perturbation(0, 1, 5, 0.5, diagonal=True))
    torch.testing.assert_close(diagonal, plain * s)
    with space.perturbed(Perturbation(0, 1, 5, 0.5, diagonal=True)):
        torch.testing.assert_close(torch.from_numpy(space.vector.copy()).float(), diagonal)


def test_scales_move_by_the_exponential_of_the_weighted_squared_noise() -> None:
    space = VectorSpace(np.zeros(D))
    terms = (Term(1, 0.25), Term(2, -0.5), Term(3, 0.1))
    eps = {t.seed: _noise(space, Perturbation(0, 4, t.seed, 1.0)) for t in terms}
    space.apply(Update(0, 4, (), 1.0, scale_terms=terms))
    expected = torch.exp(sum(t.coefficient * (eps[t.seed] ** 2 - 1) for t in terms))
    torch.testing.assert_close(space.scales(), expected)


def test_a_diagonal_step_uses_the_scales_from_before_the_update() -> None:
    space = VectorSpace(np.zeros(D))
    space.apply(Update(0, 0, (), 1.0, scale_terms=(Term(9, 0.4),)))
    before = space.scales()
    eps = _noise(space, Perturbation(0, 1, 2, 1.0)).double()
    space.apply(Update(0, 1, (Term(2, 0.5),), 0.1, diagonal=True, scale_terms=(Term(2, 0.2),)))
    np.testing.assert_allclose(space.vector, (0.1 * 0.5 * before.double() * eps).numpy())
    assert not torch.equal(space.scales(), before)


def test_seed_specs_keep_their_wire_format_and_diagonal_ones_round_trip() -> None:
    assert "diagonal" not in Perturbation(0, 0, 1, 0.1).to_dict()
    plain = Update(0, 0, (Term(1, 0.5),), 0.1).to_dict()
    assert "diagonal" not in plain and "scale_terms" not in plain
    update = Update(0, 3, (Term(1, 0.5),), 0.1, diagonal=True, scale_terms=(Term(1, 0.05),))
    assert Update.from_dict(json.loads(json.dumps(update.to_dict()))) == update


def test_the_scales_are_saved_and_loaded_with_the_space() -> None:
    space = VectorSpace(np.arange(D, dtype=float))
    space.apply(Update(0, 0, (Term(1, 0.5),), 0.1, diagonal=True, scale_terms=(Term(1, 0.3),)))
    fresh = VectorSpace(np.arange(D, dtype=float))
    fresh.load_state_dict(space.state_dict())
    assert torch.equal(fresh.scales(), space.scales())
    assert np.array_equal(fresh.vector, space.vector)


def test_snes_runs_resume_bit_identically_with_its_scales() -> None:
    def run(steps: int, space: VectorSpace, es) -> None:
        for _ in range(steps):
            members = es.ask()
            rewards = [-float(np.sum(space.materialize(p) ** 2)) for p in members]
            space.apply(es.tell(rewards))

    x0 = np.linspace(-2, 2, D)
    space, es = VectorSpace(x0), None
    es = make_strategy("snes", space, seed=3)
    run(10, space, es)
    saved_space, saved_es = space.state_dict(), json.loads(json.dumps(es.state_dict()))
    run(10, space, es)
    resumed_space = VectorSpace(x0)
    resumed_space.load_state_dict(saved_space)
    resumed = make_strategy("snes", resumed_space, seed=3)
    resumed.load_state_dict(saved_es)
    run(10, resumed_space, resumed)
    assert np.array_equal(resumed_space.vector, space.vector)
    assert torch.equal(resumed_space.scales(), space.scales())


def test_black_box_defaults_leave_snes_its_own_sigma_and_rate() -> None:
    defaults = black_box_defaults(get_strategy("snes"), 100, {})
    assert set(defaults) == {"population"} and defaults["population"] == 4 + int(3 * np.log(100))
    es = make_strategy("snes", VectorSpace(np.zeros(100)))
    assert es.sigma_rate == pytest.approx((3 + np.log(100)) / (5 * np.sqrt(100)))


def test_snes_beats_isotropic_es_on_a_separable_ill_conditioned_ellipsoid() -> None:
    d = 30
    weights = 10 ** (4 * np.arange(d) / (d - 1))

    def ellipsoid(x: np.ndarray) -> float:
        return float(np.sum(weights * x * x))

    x0 = np.full(d, 2.0)
    snes = esbox.optimize(ellipsoid, x0, strategy="snes", budget=6000, seed=0).best_value
    isotropic = esbox.optimize(ellipsoid, x0, strategy="openai_es", budget=6000, seed=0)
    assert snes < isotropic.best_value / 10, (snes, isotropic.best_value)
