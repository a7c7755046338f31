"""ARS's own maths; esbox's registry-wide contract tests cover the rest."""

from __future__ import annotations

import numpy as np
import pytest

import esbox
from esbox.space import VectorSpace


def neg_sphere(x: np.ndarray) -> float:
    return -float(np.sum(x**2))


def test_the_entry_point_registers_ars() -> None:
    assert esbox.get_strategy("ars").__name__ == "ARS"


@pytest.mark.parametrize("shaping", ["raw", "zscore"])
def test_all_directions_is_openai_es_with_zscore_shaping(shaping: str) -> None:
    common = dict(population=12, sigma=0.1, learning_rate=0.05, seed=3)
    ars = esbox.make_strategy("ars", 30, shaping=shaping, **common)
    oes = esbox.make_strategy("openai_es", 30, shaping="zscore", **common)
    a, o = VectorSpace(np.linspace(-1, 1, 30)), VectorSpace(np.linspace(-1, 1, 30))
    for _ in range(4):
        assert ars.ask() == oes.ask()  # the same antithetic pairs from the same seed stream
        rewards = [neg_sphere(a.materialize(p)) for p in ars.ask()]
        a.apply(ars.tell(rewards))
        o.apply(oes.tell(rewards))
        np.testing.assert_allclose(a.vector, o.vector, rtol=1e-12, atol=1e-12)


def test_top_directions_keeps_the_best_pairs_and_normalizes_by_their_std() -> None:
    nu, lr = 0.2, 0.5
    es = esbox.make_strategy("ars", 8, population=8, sigma=nu, learning_rate=lr, top_directions=2)
    members = es.ask()
    rewards = np.array([1.0, 0.0, 5.0, 2.0, 0.5, 3.0, 4.0, 4.5])  # max per pair: 1, 5, 3, 4.5
    update = es.tell(rewards)
    kept = [(5.0, 2.0, members[2].seed), (4.0, 4.5, members[6].seed)]
    std = np.std([5.0, 2.0, 4.0, 4.5])
    expected = {seed: (plus - minus) / (2 * 2 * nu * std) for plus, minus, seed in kept}
    assert {t.seed: t.coefficient for t in update.terms} == pytest.approx(expected)
    assert update.learning_rate == lr  # alpha = lr / (2 nu) in the paper's units


def test_bad_options_name_the_option() -> None:
    with pytest.raises(esbox.ConfigError, match="top_directions"):
        esbox.make_strategy("ars", 8, population=8, top_directions=5)
    with pytest.raises(esbox.ConfigError, match="population must be even"):
        esbox.make_strategy("ars", 8, population=7)
