"""Strategies: a contract every registered strategy meets, then each strategy's exact maths."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import esbox
from esbox import registry
from esbox.config import describe_options
from esbox.errors import ConfigError, ConfigWarning, ResumeError
from esbox.shaping import SHAPINGS, shape
from esbox.space import VectorSpace
from esbox.specs import OptimizerSpec, Perturbation, Term, Update
from esbox.strategy import Strategy


def option_names(es: Strategy) -> set[str]:
    return {f.name for f in dataclasses.fields(es.options)}


def linear_rewards(space: VectorSpace, members, w: np.ndarray) -> np.ndarray:
    return np.array([float(w @ space.materialize(p)) for p in members])


def run(es: Strategy, space: VectorSpace, steps: int, fn) -> list[Update]:
    """ask -> evaluate under perturbation -> tell -> apply, ``steps`` times."""
    updates = []
    for _ in range(steps):
        members = es.ask()
        rewards = [fn(space.materialize(p)) for p in members]
        update = es.tell(rewards)
        space.apply(update)
        updates.append(update)
    return updates


def neg_sphere(x: np.ndarray) -> float:
    return -float(np.sum(x**2))


# == the contract, for every registered strategy =================================================
def test_registry_holds_the_builtin_strategies() -> None:
    assert {"openai_es", "copes", "esopt"} <= set(esbox.available_strategies())


def test_strategy_is_documented(strategy_name: str) -> None:
    cls = esbox.get_strategy(strategy_name)
    assert issubclass(cls, Strategy)
    assert cls.name == strategy_name
    assert cls.description and cls.__doc__
    for row in describe_options(cls.Options):
        assert row["help"], f"option {row['name']} has no help text"


def test_ask_returns_the_population_as_serialisable_specs(build_strategy) -> None:
    es = build_strategy(seed=3)
    members = es.ask()
    assert len(members) == es.options.population == 8
    for p in members:
        assert isinstance(p, Perturbation)
        assert p.run_seed == 3 and p.step == 0
        assert math.isfinite(p.scale) and p.scale != 0
        assert Perturbation(**json.loads(json.dumps(p.to_dict()))) == p
    assert es.ask() == members  # asking again before tell returns the same population


def test_members_are_distinct_directions(build_strategy) -> None:
    es = build_strategy()
    space = VectorSpace(np.zeros(12))
    points = [space.materialize(p) for p in es.ask()]
    distinct = {tuple(x) for x in points}
    assert len(distinct) == len(points)
    for x in points:
        assert np.any(x != 0)


def test_tell_without_ask_is_an_error(build_strategy) -> None:
    es = build_strategy()
    with pytest.raises(RuntimeError, match="ask"):
        es.tell(np.zeros(8))
    es.ask()
    es.tell(np.arange(8.0))
    with pytest.raises(RuntimeError, match="ask"):  # one tell per ask
        es.tell(np.arange(8.0))


def test_tell_with_the_wrong_number_of_rewards_is_an_error(build_strategy) -> None:
    es = build_strategy()
    es.ask()
    with pytest.raises(ValueError, match="7 rewards for 8 members"):
        es.tell(np.zeros(7))
    assert es.step == 0
    es.tell(np.zeros(8))  # the pending ask survives the bad call


def test_tell_returns_an_update_and_advances_the_step(build_strategy) -> None:
    es = build_strategy(seed=5)
    for t in range(3):
        es.ask()
        update = es.tell(np.random.default_rng(t).normal(size=8))
        assert isinstance(update, Update)
        assert (update.step, update.run_seed, es.step) == (t, 5, t + 1)
        assert update.terms or update.shift  # noise terms, or an explicit step (nevergrad)
        assert all(isinstance(term, Term) for term in update.terms)
        assert all(math.isfinite(term.coefficient) for term in update.terms)
        assert update.learning_rate == 0.05
        assert Update.from_dict(json.loads(json.dumps(update.to_dict()))) == update
        assert es.ask()[0].step == t + 1


def test_same_seed_same_run_different_seed_different_run(build_strategy) -> None:
    def final(seed: int) -> tuple[np.ndarray, list[dict]]:
        space = VectorSpace(np.linspace(-1, 1, 12))
        updates = run(build_strategy(seed=seed), space, 3, neg_sphere)
        return space.vector.copy(), [u.to_dict() for u in updates]

    x_a, u_a = final(0)
    x_b, u_b = final(0)
    x_c, _ = final(1)
    assert np.array_equal(x_a, x_b) and u_a == u_b
    assert not np.array_equal(x_a, x_c)


@pytest.mark.parametrize("shaping", SHAPINGS)
def test_all_equal_rewards_give_a_zero_update(build_strategy, shaping: str) -> None:
    es = build_strategy(shaping=shaping)
    if "antithetic" in option_names(es):  # without pairs nothing cancels by symmetry
        es = build_strategy(shaping=shaping, antithetic=False)
    space = VectorSpace(np.linspace(-1, 1, 12))
    before = space.vector.copy()
    es.ask()
    update = es.tell(np.full(8, 2.5))
    assert space.apply(update) == 0.0
    assert np.array_equal(space.vector, before)


def test_nonfinite_rewards_count_as_the_worst(build_strategy) -> None:
    rewards = np.array([1.0, np.nan, 3.0, np.inf, 0.5, -np.inf, 2.0, 4.0])
    worst = np.where(np.isfinite(rewards), rewards, 0.5)
    a, b = build_strategy(seed=2), build_strategy(seed=2)
    a.ask(), b.ask()
    update = a.tell(rewards)
    assert update == b.tell(worst)
    assert all(math.isfinite(t.coefficient) for t in update.terms)
    assert a.metrics["nonfinite_rewards"] == 3
    assert a.best_reward == 4.0  # +inf is a failure, never the best
    space = VectorSpace(np.zeros(12))
    space.apply(update)
    assert np.all(np.isfinite(space.vector))


def test_all_nonfinite_rewards_give_a_zero_update(build_strategy) -> None:
    es = build_strategy()
    es.ask()
    update = es.tell(np.full(8, np.nan))
    space = VectorSpace(np.ones(12))
    assert space.apply(update) == 0.0
    assert es.metrics["nonfinite_rewards"] == 8
    assert es.best_reward == -np.inf


def test_update_ascends_a_linear_reward(build_strategy) -> None:
    """Rewards are maximized: on r(x) = w.x every step must move theta along +w."""
    w = np.random.default_rng(0).normal(size=12)
    es = build_strategy(population=16, seed=1)
    space = VectorSpace(np.zeros(12))
    for _ in range(5):
        before = space.vector.copy()
        es.ask()
        space.apply(es.tell(linear_rewards(space, es.ask(), w)))
        assert w @ (space.vector - before) > 0


def test_a_few_steps_improve_the_sphere(build_strategy, natural_rates) -> None:
    es = build_strategy(population=16, sigma=0.1, seed=4, **{"learning_rate": 0.1, **natural_rates})
    space = VectorSpace(np.full(12, 2.0))
    start = neg_sphere(space.vector)
    run(es, space, 30, neg_sphere)
    assert neg_sphere(space.vector) > 0.5 * start  # the cost at least halves


def test_bookkeeping_tracks_the_best_member(build_strategy) -> None:
    es = build_strategy()
    members = es.ask()
    rewards = np.array([0.0, 5.0, 1.0, 2.0, -1.0, 3.0, 4.0, 0.5])
    es.tell(rewards)
    assert es.best_reward == 5.0
    assert es.best_perturbation == members[1]
    for key in ("step", "sigma", "learning_rate", "reward_mean", "reward_max", "best_reward"):
        assert key in es.metrics
    assert es.metrics["reward_max"] == 5.0
    assert es.metrics["reward_mean"] == pytest.approx(rewards.mean())
    es.ask()
    es.tell(np.zeros(8))  # a worse step keeps the best so far
    assert es.best_reward == 5.0 and es.best_perturbation == members[1]


@pytest.mark.parametrize("pending", [False, True], ids=["between-steps", "pending-ask"])
def test_state_dict_round_trip_continues_identically(build_strategy, pending: bool) -> None:
    a = build_strategy(seed=9)
    space_a = VectorSpace(np.linspace(0, 1, 12))
    run(a, space_a, 2, neg_sphere)
    if pending:
        a.ask()
    state = json.loads(json.dumps(a.state_dict()))  # JSON all the way, no pickle
    b = build_strategy(seed=9)
    b.load_state_dict(state)
    space_b = VectorSpace(np.zeros(12))
    space_b.load_state_dict(space_a.state_dict())  # the space's part of a checkpoint (SNES's s)
    assert b.step == a.step == 2
    assert b.ask() == a.ask()
    ua, ub = run(a, space_a, 3, neg_sphere), run(b, space_b, 3, neg_sphere)
    assert [u.to_dict() for u in ua] == [u.to_dict() for u in ub]
    assert np.array_equal(space_a.vector, space_b.vector)


def test_load_state_dict_refuses_another_configuration(build_strategy) -> None:
    state = build_strategy(seed=1).state_dict()
    with pytest.raises(ResumeError, match="seed"):
        build_strategy(seed=2).load_state_dict(state)
    with pytest.raises(ResumeError, match="options"):
        build_strategy(seed=1, sigma=0.3).load_state_dict(state)
    with pytest.raises(ResumeError, match="dimension"):
        build_strategy(dimension=13, seed=1).load_state_dict(state)
    others = [n for n in esbox.available_strategies() if n != state["name"]]
    for other in others:
        with pytest.raises(ResumeError, match="name"):
            esbox.make_strategy(other, 12, seed=1).load_state_dict(state)


@pytest.mark.parametrize(
    "sigma", [0.0, -0.1, {"kind": "cosine", "start": 0.1, "end": 0.0, "steps": 5}]
)
def test_sigma_must_be_positive(build_strategy, sigma) -> None:
    with pytest.raises(ConfigError, match="sigma"):
        build_strategy(sigma=sigma)


@pytest.mark.parametrize(
    ("typo", "nearest"), [("sigmaa", "sigma"), ("populaton", "population"), ("lr_rate", None)]
)
def test_unknown_option_names_the_nearest_valid_one(build_strategy, typo, nearest) -> None:
    with pytest.raises(ConfigError, match=typo) as info:
        build_strategy(**{typo: 1})
    message = str(info.value)
    if nearest:
        assert f"did you mean '{nearest}'" in message
    assert "learning_rate" in message  # the allowed options are listed


@pytest.mark.parametrize(
    "bad",
    [{"population": "8"}, {"population": 0}, {"shaping": "softmax"}, {"optimizer": "lion"}],
)
def test_bad_option_values_are_config_errors(build_strategy, bad) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        build_strategy(**bad)


def test_bad_dimension_is_a_config_error(strategy_name: str) -> None:
    for dimension in (0, -3):
        with pytest.raises(ConfigError, match="dimension"):
            esbox.make_strategy(strategy_name, dimension)


def test_make_strategy_accepts_a_space(strategy_name: str) -> None:
    es = esbox.make_strategy(strategy_name, VectorSpace(np.zeros(7)), population=8)
    assert es.dimension == 7


def test_update_lies_in_the_span_of_the_members_noise(build_strategy) -> None:
    """An update is a combination of its members' replayed noise (from ``space.noise``) only."""
    d = 40
    es = build_strategy(dimension=d, seed=11)
    space = VectorSpace(np.linspace(-1, 1, d), chunk_size=7)
    members = es.ask()
    rows = np.stack(
        [np.concatenate([e.double().numpy().copy() for _, e in space.noise(p)]) for p in members]
    )
    theta = space.vector.copy()
    space.apply(es.tell(np.random.default_rng(0).normal(size=len(members))))
    delta = space.vector - theta
    coef, *_ = np.linalg.lstsq(rows.T, delta, rcond=None)
    assert np.linalg.norm(delta) > 0
    assert np.linalg.norm(rows.T @ coef - delta) < 1e-6 * np.linalg.norm(delta)
    # and not in the span of another step's noise
    other = build_strategy(dimension=d, seed=12).ask()
    rows = np.stack(
        [np.concatenate([e.double().numpy().copy() for _, e in space.noise(p)]) for p in other]
    )
    coef, *_ = np.linalg.lstsq(rows.T, delta, rcond=None)
    assert np.linalg.norm(rows.T @ coef - delta) > 0.1 * np.linalg.norm(delta)


# == registry ======================================================================================
def test_unknown_strategy_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        esbox.make_strategy("cope", 4)
    message = str(info.value)
    assert "did you mean 'copes'" in message
    for name in esbox.available_strategies():
        assert name in message


def test_registering_a_name_twice_is_an_error() -> None:
    class Other(esbox.get_strategy("openai_es")):
        pass

    with pytest.raises(ValueError, match="already registered"):
        esbox.register("openai_es")(Other)
    assert esbox.get_strategy("openai_es") is not Other
    # re-registering the same class under its own name is harmless
    cls = esbox.get_strategy("copes")
    assert esbox.register("copes")(cls) is cls


def test_entry_point_plugins_are_discovered(monkeypatch: pytest.MonkeyPatch) -> None:
    class Plugin(esbox.get_strategy("openai_es")):
        """A plugin strategy."""

    _fake_plugins(monkeypatch, [FakeEntryPoint("plugin_es", lambda: Plugin)])
    assert esbox.available_strategies()["plugin_es"] is Plugin
    assert esbox.make_strategy("plugin_es", 4).name == "plugin_es"


class FakeEntryPoint:
    """What ``importlib.metadata.entry_points`` yields, with ``load`` given."""

    def __init__(self, name: str, load) -> None:
        self.name, self.value, self.dist, self.load = name, f"fake_{name}:Strategy", None, load


def _fake_plugins(monkeypatch: pytest.MonkeyPatch, plugins: list[FakeEntryPoint]) -> None:
    def fake_entry_points(group: str):
        return plugins if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_a_broken_plugin_is_named_and_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken():
        raise ModuleNotFoundError("No module named 'fake_broken'")

    _fake_plugins(
        monkeypatch, [FakeEntryPoint("broken", broken), FakeEntryPoint("odd", lambda: print)]
    )
    with pytest.warns(ConfigWarning) as caught:
        names = esbox.available_strategies()
    messages = [str(w.message) for w in caught]
    assert any("'broken'" in m and "No module named 'fake_broken'" in m for m in messages)
    assert any("'odd'" in m and "not a Strategy subclass" in m for m in messages)
    assert "broken" not in names and "odd" not in names and "copes" in names


# == OpenAI-ES =====================================================================================
def test_openai_es_is_antithetic_by_default() -> None:
    es = esbox.make_strategy("openai_es", 10, population=6, sigma=0.3)
    members = es.ask()
    for plus, minus in zip(members[::2], members[1::2], strict=True):
        assert plus.seed == minus.seed and plus.scale == 0.3 and minus.scale == -0.3
    space = VectorSpace(np.zeros(10))
    assert np.array_equal(space.materialize(members[0]), -space.materialize(members[1]))
    assert len({p.seed for p in members}) == 3


def test_openai_es_odd_population_needs_antithetic_off() -> None:
    with pytest.raises(ConfigError, match="even"):
        esbox.make_strategy("openai_es", 4, population=5)
    es = esbox.make_strategy("openai_es", 4, population=5, antithetic=False)
    assert len({p.seed for p in es.ask()}) == 5


@pytest.mark.parametrize("antithetic", [True, False])
@pytest.mark.parametrize("shaping", ["centered_ranks", "zscore"])
def test_openai_es_gradient_is_canonical(antithetic: bool, shaping: str) -> None:
    """g = sum_i r_i eps_i / (N sigma), checked against explicit noise rows and shaping."""
    n, d, sigma, lr = 8, 30, 0.2, 0.1
    es = esbox.make_strategy(
        "openai_es",
        d,
        population=n,
        sigma=sigma,
        learning_rate=lr,
        antithetic=antithetic,
        shaping=shaping,
        seed=6,
    )
    space = VectorSpace(np.random.default_rng(1).normal(size=d), chunk_size=7)
    theta = space.vector.copy()
    members = es.ask()
    # eps_i (with its antithetic sign) as explicit rows: noise(p) = scale * eps
    eps = np.stack(
        [np.concatenate([e.double().numpy() / p.scale for _, e in space.noise(p)]) for p in members]
    )
    eps *= np.array([[p.sign] for p in members])
    rewards = np.random.default_rng(2).normal(size=n)
    shaped = shape(rewards, shaping)
    expected = theta + lr * (shaped @ eps) / (n * sigma)
    space.apply(es.tell(rewards))
    np.testing.assert_allclose(space.vector, expected, rtol=1e-6, atol=1e-7)


def test_openai_es_with_adam_matches_a_hand_written_adam() -> None:
    n, d, lr = 8, 25, 0.05
    options = dict(population=n, sigma=0.1, learning_rate=lr, optimizer="adam", beta1=0.8)
    es = esbox.make_strategy("openai_es", d, seed=2, **options)
    space = VectorSpace(np.ones(d), chunk_size=9)
    theta, m, v = space.vector.copy(), np.zeros(d), np.zeros(d)
    for t in range(1, 5):
        members = es.ask()
        eps = np.stack(
            [
                np.concatenate([e.double().numpy() for _, e in space.noise(p)]) / p.scale * p.sign
                for p in members
            ]
        )
        rewards = np.array([neg_sphere(space.materialize(p)) for p in members])
        g = shape(rewards, "centered_ranks") @ eps / (n * 0.1)
        m = 0.8 * m + 0.2 * g
        v = 0.999 * v + 0.001 * g**2
        theta = theta + lr * (m / (1 - 0.8**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        space.apply(es.tell(rewards))
        np.testing.assert_allclose(space.vector, theta, rtol=1e-5, atol=1e-6)
        theta = space.vector.copy()
    assert es.optimizer == OptimizerSpec("adam", beta1=0.8)


# == CoPES ========================================================================================
@pytest.mark.parametrize("shaping", ["centered_ranks", "zscore"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_copes_with_one_subspace_is_openai_es_bit_for_bit(shaping: str, optimizer: str) -> None:
    common = dict(population=12, sigma=0.07, learning_rate=0.03, shaping=shaping,
                  optimizer=optimizer, seed=42)  # fmt: skip
    copes = esbox.make_strategy("copes", 20, subspaces=1, **common)
    oes = esbox.make_strategy("openai_es", 20, **common)
    x0 = np.random.default_rng(0).normal(size=20)
    space_c, space_o = VectorSpace(x0), VectorSpace(x0)
    for _ in range(5):
        assert copes.ask() == oes.ask()
        rewards = [neg_sphere(space_c.materialize(p)) for p in copes.ask()]
        uc, uo = copes.tell(rewards), oes.tell(rewards)
        assert uc == uo
        space_c.apply(uc)
        space_o.apply(uo)
        assert np.array_equal(space_c.vector, space_o.vector)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_copes_sigma_k_is_sqrt_k_sigma(k: int) -> None:
    es = esbox.make_strategy("copes", 40, population=16, subspaces=k, sigma=0.05)
    assert {abs(p.scale) for p in es.ask()} == {math.sqrt(k) * 0.05}
    flat = esbox.make_strategy(
        "copes", 40, population=16, subspaces=k, sigma=0.05, scale_sigma=False
    )
    assert {abs(p.scale) for p in flat.ask()} == {0.05}


def test_copes_dimension_aware_scale_keeps_the_perturbation_norm() -> None:
    """E||sigma_k P_k eps||^2 = E||sigma eps||^2 when sigma_k = sqrt(K) sigma."""
    d, k = 4000, 4
    es = esbox.make_strategy("copes", d, population=8, subspaces=k, sigma=0.1)
    space = VectorSpace(np.zeros(d))
    norms = [np.sum(space.materialize(p) ** 2) for p in es.ask()]
    assert np.mean(norms) == pytest.approx(0.1**2 * d, rel=0.05)


def test_copes_members_split_evenly_over_the_subspaces() -> None:
    es = esbox.make_strategy("copes", 40, population=12, subspaces=3, antithetic=False)
    members = es.ask()
    assert all(p.num_subspaces == 3 for p in members)
    assert sorted(p.subspace for p in members) == [0] * 4 + [1] * 4 + [2] * 4
    ablation = esbox.make_strategy("copes", 40, population=12, subspaces=3, partition=False)
    assert all(p.num_subspaces == 1 for p in ablation.ask())  # standard ES, sigma * sqrt(K)
    assert {abs(p.scale) for p in ablation.ask()} == {math.sqrt(3) * 0.02}


def test_copes_member_perturbs_only_its_subspace_and_subspaces_tile() -> None:
    d, k = 60, 4
    es = esbox.make_strategy("copes", d, population=8, subspaces=k, seed=3)
    space = VectorSpace(np.zeros(d), chunk_size=16)
    support = {}
    for p in es.ask():
        nonzero = space.materialize(p) != 0
        support.setdefault(p.subspace, nonzero)
        assert np.array_equal(support[p.subspace], nonzero)  # same subspace, same coordinates
    stacked = np.stack([support[s] for s in range(k)])
    assert np.all(stacked.sum(axis=0) == 1)  # disjoint and covering
    sizes = stacked.sum(axis=1)
    assert sizes.max() - sizes.min() <= 1
    # a new step draws a new partition
    es.tell(np.arange(8.0))
    p = es.ask()[0]
    assert not np.array_equal(space.materialize(p) != 0, support[p.subspace])


def test_copes_update_touches_each_coordinate_only_through_its_subspace() -> None:
    d, k = 50, 5
    es = esbox.make_strategy("copes", d, population=20, subspaces=k, seed=8)
    space = VectorSpace(np.zeros(d), chunk_size=16)
    members = es.ask()
    masks = {p.subspace: space.materialize(p) != 0 for p in members}
    update = es.tell(np.random.default_rng(0).normal(size=20))
    full = VectorSpace(np.zeros(d), chunk_size=16)
    full.apply(update)
    total = np.zeros(d)
    for s in range(k):
        part = VectorSpace(np.zeros(d), chunk_size=16)
        part.apply(
            dataclasses.replace(update, terms=tuple(t for t in update.terms if t.subspace == s))
        )
        assert np.all(part.vector[~masks[s]] == 0)
        assert np.all(part.vector[masks[s]] != 0)
        total += part.vector
    assert np.array_equal(full.vector, total)


def shaped_from_terms(es: Strategy, members, update: Update) -> np.ndarray:
    """Recover r_hat_i = coef_i * N_k * sigma_k (valid without antithetic pairs)."""
    by_seed = {(t.seed, t.subspace): t.coefficient for t in update.terms}
    n_k = es.options.population // es.options.subspaces
    return np.array([by_seed[(p.seed, p.subspace)] * n_k * abs(p.scale) for p in members])


def test_copes_joint_standardization_has_mean_zero_and_std_one() -> None:
    es = esbox.make_strategy("copes", 30, population=16, subspaces=4, antithetic=False, seed=1)
    members = es.ask()
    rewards = np.random.default_rng(3).normal(size=16) + np.repeat([0.0, 10.0, 20.0, 30.0], 4)
    shaped = shaped_from_terms(es, members, es.tell(rewards))
    assert abs(shaped.mean()) < 1e-12
    assert abs(shaped.std() - 1.0) < 1e-12
    np.testing.assert_allclose(shaped, (rewards - rewards.mean()) / rewards.std(), atol=1e-12)
    groups = np.array([p.subspace for p in members])
    assert shaped[groups == 3].mean() > 1.0  # joint: a better subspace keeps its advantage


def test_copes_per_subspace_standardization_is_the_ablation() -> None:
    es = esbox.make_strategy(
        "copes", 30, population=16, subspaces=4, antithetic=False, seed=1,
        standardization="per_subspace",
    )  # fmt: skip
    members = es.ask()
    rewards = np.random.default_rng(3).normal(size=16) + np.repeat([0.0, 10.0, 20.0, 30.0], 4)
    shaped = shaped_from_terms(es, members, es.tell(rewards))
    groups = np.array([p.subspace for p in members])
    for s in range(4):
        assert abs(shaped[groups == s].mean()) < 1e-12
        assert abs(shaped[groups == s].std() - 1.0) < 1e-12


def test_copes_gradient_per_subspace_is_canonical() -> None:
    """g_k = sum_i r_ki P_k eps_ki / (N_k sigma_k); theta += lr sum_k g_k."""
    n, k, d, sigma, lr = 12, 3, 40, 0.1, 0.2
    es = esbox.make_strategy("copes", d, population=n, subspaces=k, sigma=sigma, learning_rate=lr)
    space = VectorSpace(np.zeros(d), chunk_size=13)
    members = es.ask()
    rows = np.stack(
        [np.concatenate([e.double().numpy() for _, e in space.noise(p)]) for p in members]
    )
    sigma_k = math.sqrt(k) * sigma
    masked_eps = rows / sigma_k  # noise(p) = sign * sigma_k * P_k eps
    rewards = np.random.default_rng(0).normal(size=n)
    shaped = shape(rewards, "zscore")
    expected = lr * (shaped @ masked_eps) / ((n // k) * sigma_k)
    space.apply(es.tell(rewards))
    np.testing.assert_allclose(space.vector, expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(("population", "k"), [(10, 4), (12, 5), (7, 2)])
def test_copes_population_must_be_divisible_by_k(population: int, k: int) -> None:
    with pytest.raises(ConfigError, match=rf"population \({population}\).*subspaces \({k}\)"):
        esbox.make_strategy("copes", 50, population=population, subspaces=k)


def test_copes_antithetic_needs_even_members_per_subspace() -> None:
    with pytest.raises(ConfigError, match="antithetic"):
        esbox.make_strategy("copes", 50, population=12, subspaces=4)
    assert (
        len(esbox.make_strategy("copes", 50, population=12, subspaces=4, antithetic=False).ask())
        == 12
    )


# == ESOpt ========================================================================================
def test_esopt_sigma_follows_the_cosine_decay() -> None:
    sigma0, ratio, horizon = 0.3, 0.1, 10
    es = esbox.make_strategy(
        "esopt", 8, population=4, sigma=sigma0, decay_steps=horizon, sigma_min_ratio=ratio
    )
    sigma_min = sigma0 * ratio
    for t in range(14):
        expected = sigma_min + 0.5 * (sigma0 - sigma_min) * (
            1 + math.cos(math.pi * min(t, horizon) / horizon)
        )
        scales = [abs(p.scale) for p in es.ask()]
        assert scales == pytest.approx([expected] * 4, rel=1e-12)
        es.tell(np.arange(4.0))
    constant = esbox.make_strategy("esopt", 8, population=4, sigma={"value": 0.3})
    for _ in range(3):
        assert {abs(p.scale) for p in constant.ask()} == {0.3}
        constant.tell(np.arange(4.0))


def test_esopt_update_is_reward_weighted_without_one_over_sigma() -> None:
    """theta += alpha / N sum_i z_i eps_i (no 1/sigma)."""
    n, d, lr = 6, 20, 0.5
    es = esbox.make_strategy("esopt", d, population=n, sigma=0.4, learning_rate=lr, seed=3)
    space = VectorSpace(np.zeros(d), chunk_size=8)
    members = es.ask()
    eps = np.stack(
        [np.concatenate([e.double().numpy() for _, e in space.noise(p)]) / p.scale for p in members]
    )
    rewards = np.random.default_rng(0).normal(size=n)
    expected = lr * shape(rewards, "zscore") @ eps / n
    space.apply(es.tell(rewards))
    np.testing.assert_allclose(space.vector, expected, rtol=1e-6, atol=1e-8)


def test_esopt_coevolves_contexts() -> None:
    proposals = []

    def proposer(best: str, contexts, scores) -> str:
        proposals.append((best, list(contexts), list(scores)))
        return f"new-{len(proposals)}"

    es = esbox.get_strategy("esopt")(
        4, population=6, contexts=["a", "b", "c"], context_proposer=proposer, evolve_every=2
    )
    members = es.ask()
    assert [p.context for p in members] == [0, 1, 2, 0, 1, 2]
    es.tell(np.array([1.0, 5.0, 0.0, 3.0, 7.0, 2.0]))
    assert es.context_scores == [2.0, 6.0, 1.0]
    assert es.best_context == "b"
    assert proposals == []
    es.ask()
    es.tell(np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    assert es.context_scores[:2] == [1.5, 3.5]  # online score: 0.5 past + 0.5 new
    assert len(proposals) == 1 and proposals[0][0] == "b"
    assert es.contexts == ["a", "b", "new-1"]  # the worst context is replaced
    assert math.isnan(es.context_scores[2])
    state = json.loads(json.dumps(es.state_dict()))
    other = esbox.get_strategy("esopt")(4, population=6, contexts=["a", "b", "c"], evolve_every=2)
    other.load_state_dict(state)
    assert other.contexts == es.contexts and other.ask() == es.ask()


def test_esopt_standardizes_within_each_context() -> None:
    es = esbox.make_strategy("esopt", 4, population=8, contexts=["x", "y"], sigma=0.5, seed=0)
    members = es.ask()
    rewards = np.array([1.0, 100.0, 2.0, 200.0, 3.0, 300.0, 4.0, 400.0])
    update = es.tell(rewards)
    coef = {t.seed: t.coefficient for t in update.terms}
    shaped = np.array([coef[p.seed] * 8 for p in members])
    groups = np.array([p.context for p in members])
    for c in (0, 1):
        np.testing.assert_allclose(shaped[groups == c], shape(rewards[groups == c], "zscore"))


def test_a_checkpoint_from_before_an_option_existed_resumes_with_its_default() -> None:
    es = esbox.make_strategy("openai_es", 12, seed=3, population=8)
    es.ask()
    state = json.loads(json.dumps(es.state_dict()))
    del state["options"]["rank"], state["options"]["perturbation"]  # written by an older esbox
    resumed = esbox.make_strategy("openai_es", 12, seed=3, population=8)
    resumed.load_state_dict(state)
    assert resumed.ask() == es.ask()
    with pytest.raises(ResumeError, match="options"):  # a non-default value is still refused
        esbox.make_strategy("openai_es", 12, seed=3, population=8, rank=8).load_state_dict(state)
