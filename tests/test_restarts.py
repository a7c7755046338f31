"""Termination criteria and restarts on vectors (esbox.restarts): each criterion fires when it
should and only then; IPOP doubles the population from a new start, BIPOP alternates regimes;
the result is the best over all restarts; model spaces never restart."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import esbox
from esbox.adapters.functions import get_function
from esbox.cli.main import cli
from esbox.errors import ConfigError
from esbox.restarts import RestartOptions, Termination, resolve_kind, restart_options
from esbox.space import VectorSpace
from esbox.specs import Update
from esbox.strategies.copes import CoPES

RASTRIGIN = get_function("rastrigin")


def termination(**options) -> Termination:
    return Termination(RestartOptions(**options), dimension=10, population=10)


def test_tolx_fires_when_sigma_falls_below_tolx_relative_to_x() -> None:
    rewards = np.arange(5.0)
    crit = termination(tolx=1e-6, stagnation_steps=0)
    assert crit.check(rewards, 1e-5, x_rms=1.0) is None
    assert crit.check(rewards + 1, 2e-6, x_rms=10.0) == "tolx"  # relative to |x| = 10
    assert termination(tolx=1e-6).check(rewards, 2e-6, x_rms=1.0) is None
    assert termination(tolx=1e-6).check(rewards, 9e-7, x_rms=0.01) == "tolx"  # at least 1e-6
    assert termination(tolx=1e-6).check(rewards, None, x_rms=1.0) is None  # no sigma: no tolx


def test_tolfun_fires_after_k_steps_without_improvement_only() -> None:
    crit = termination(tolfun=1e-3, tolfun_steps=4, stagnation_steps=0)
    for step in range(10):  # improving by 1 a step: never
        assert crit.check(np.array([float(step), step - 1.0]), 1.0, 1.0) is None
    flat = [crit.check(np.array([9.0 + 1e-4 * i, 0.0]), 1.0, 1.0) for i in range(5)]
    # the last improving step and 3 flat ones: k = 4 steps gaining 3e-4 < 1e-3 (1 + 9)
    assert flat == [None, None, None, "tolfun", "tolfun"]
    assert termination(tolfun_steps=4).k == 4
    assert termination().k == 10 + 30  # 10 + ceil(30 d / N)


def test_stagnation_compares_the_median_of_the_newest_and_oldest_steps() -> None:
    crit = termination(tolfun_steps=1000, stagnation_steps=10)
    rng = np.random.default_rng(0)
    reasons = [crit.check(rng.normal(size=6) + 0.1 * t, 1.0, 1.0) for t in range(20)]
    assert set(reasons) == {None}  # the medians rise
    crit = termination(tolfun_steps=1000, stagnation_steps=10)
    reasons = [crit.check(rng.normal(size=6), 1.0, 1.0) for _ in range(40)]
    assert "stagnation" in reasons and reasons[:9] == [None] * 9
    off = termination(tolfun_steps=1000, stagnation_steps=0)
    assert {off.check(rng.normal(size=6), 1.0, 1.0) for _ in range(300)} == {None}


def test_ipop_restarts_double_the_population_from_a_new_start() -> None:
    x0 = RASTRIGIN.default_x0(10, seed=0)
    result = esbox.optimize(RASTRIGIN, x0, "copes", budget=15000, seed=1, subspaces=2)
    assert len(result.restarts) >= 2
    populations = [r["population"] for r in result.restarts]
    assert populations == [populations[0] * 2**i for i in range(len(populations))]
    assert {r["reason"] for r in result.restarts} <= {"tolx", "tolfun", "stagnation"}
    column = [m["restart"] for m in result.history]
    assert column == sorted(column) and column[-1] == len(result.restarts)
    ends = [r["end_step"] for r in result.restarts]
    assert ends == [i + 1 for i, (a, b) in enumerate(itertools.pairwise(column)) if a != b]
    sigmas = [m["sigma"] for m in result.history]
    assert min(sigmas) > 1e-12  # no step runs at a collapsed sigma
    per_restart = {r: min(-m["reward_max"] for m in result.history if m["restart"] == r)
                   for r in set(column)}  # fmt: skip
    assert result.best_value == min(per_restart.values())  # the best over all restarts
    assert result.best_value == RASTRIGIN(result.best_x)
    best = [m["best_reward"] for m in result.history]  # the run's best, across restarts
    assert best == sorted(best) and best[-1] == -result.best_value
    first = result.history[ends[0]]  # a fresh sigma and population at the restart
    assert first["sigma"] == 1.0 and len(result.history) == result.steps


def test_stop_ends_the_run_with_the_criterion_and_max_restarts_caps_them() -> None:
    x0 = RASTRIGIN.default_x0(10, seed=0)
    stop = esbox.optimize(RASTRIGIN, x0, "copes", budget=15000, subspaces=2, restarts="stop")
    assert stop.stop_reason in {"tolx", "tolfun", "stagnation"} and stop.evaluations < 15000
    assert [r["reason"] for r in stop.restarts] == [stop.stop_reason]
    assert {m["restart"] for m in stop.history} == {0}
    capped = esbox.optimize(
        RASTRIGIN, x0, "copes", budget=15000, subspaces=2, restarts={"max_restarts": 1}
    )
    assert len(capped.restarts) == 2 and capped.stop_reason == capped.restarts[-1]["reason"]
    off = esbox.optimize(RASTRIGIN, x0, "copes", budget=15000, subspaces=2, restarts="none")
    assert off.stop_reason == "max_evaluations" and off.restarts == []
    assert off.history[-1]["sigma"] < 1e-20  # what the default no longer does
    assert "restart" not in off.history[0]


def test_bipop_alternates_large_and_small_populations_with_smaller_sigma() -> None:
    x0 = RASTRIGIN.default_x0(10, seed=0)
    result = esbox.optimize(
        RASTRIGIN, x0, "openai_es", budget=20000, seed=3, restarts={"kind": "bipop"}
    )
    regimes = [r["regime"] for r in result.restarts]
    assert "small" in regimes and regimes[0] == "large"
    starts = [0] + [r["end_step"] for r in result.restarts]
    for record, start in zip(result.restarts, starts[:-1], strict=True):  # its first sigma
        sigma = result.history[start]["sigma"]
        assert sigma == 1.0 if record["regime"] == "large" else 0.01 <= sigma < 1.0
    large = [r["population"] for r in result.restarts if r["regime"] == "large"]
    small = [r["population"] for r in result.restarts if r["regime"] == "small"]
    assert large == sorted(large) and len(set(large)) == len(large)  # doubling
    assert max(small) <= max(large)


def test_the_readme_default_command_restarts_and_beats_a_collapsed_sigma(tmp_path) -> None:
    """``esbox optimize --strategy copes``: 638.76 at sigma ~ 1e-43 without restarts."""
    runs = {}
    for name, extra in (("default", []), ("off", ["--set", "restarts.kind=none"])):
        out = tmp_path / name
        args = ["optimize", "-q", "--strategy", "copes", "--out", str(out), *extra]
        assert CliRunner().invoke(cli, args).exit_code == 0
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        runs[name] = (json.loads((out / "summary.json").read_text()), rows)
    summary, rows = runs["default"]
    assert summary["evaluations"] <= 20000 and summary["restarts"]
    assert max(row["restart"] for row in rows) == len(summary["restarts"])
    assert min(row["sigma"] for row in rows) > 1e-12
    assert summary["best_value"] < runs["off"][0]["best_value"] - 100
    assert runs["off"][0]["best_value"] == pytest.approx(638.76, abs=0.01)


def test_auto_restarts_vectors_with_adaptive_sigma_only_and_never_model_spaces() -> None:
    from esbox.adapters.models import TorchModuleSpace

    space = TorchModuleSpace(torch.nn.Linear(3, 2))
    assert resolve_kind(restart_options("auto"), space, CoPES) == "none"
    assert resolve_kind(restart_options("auto"), VectorSpace(np.zeros(3)), CoPES) == "ipop"
    with pytest.raises(ConfigError, match=r"restarts\.kind ipop"):
        resolve_kind(restart_options("ipop"), space, CoPES)
    fixed = resolve_kind(restart_options("auto"), VectorSpace(np.zeros(3)), CoPES, adaptive=False)
    assert fixed == "none"  # a fixed or scheduled sigma does not collapse
    assert restart_options(None).kind == restart_options(False).kind == "none"
    with pytest.raises(ConfigError, match="kind"):
        restart_options({"kind": "ipopp"})


def test_a_restart_update_moves_to_its_point_and_resets_scales_and_moments() -> None:
    space = VectorSpace(np.zeros(6))
    es = esbox.make_strategy("snes", space, seed=0, population=6)
    for _ in range(3):
        es.ask()
        space.apply(es.tell(np.arange(6.0)))
    assert not torch.equal(space.scales(), torch.ones(6))
    target = np.linspace(-1, 1, 6)
    update = Update(0, 3, (), 0.0, shift=tuple(target.tolist()), restart=True)
    assert Update.from_dict(json.loads(json.dumps(update.to_dict()))) == update
    assert "restart" not in Update(0, 3, (), 0.0, shift=(0.0,) * 6).to_dict()  # wire format
    space.apply(update)
    assert np.allclose(space.vector, target, atol=1e-15)
    assert torch.equal(space.scales(), torch.ones(6, dtype=torch.float32))
    with pytest.raises(ValueError, match="restart"):
        Update(0, 3, (), 0.0, restart=True)


def test_bounds_start_restarts_uniformly_in_the_box_and_set_cma_sigma_0() -> None:
    x0 = RASTRIGIN.default_x0(6, seed=0)
    box = (np.full(6, -5.0), np.full(6, 5.0))
    points = []  # the space's point after each step: a restart's step ends at its new start

    def record(runner, metrics):
        points.append(runner.space.vector.copy())

    result = esbox.optimize(RASTRIGIN, x0, budget=6000, seed=2, bounds=box, callbacks=[record])
    assert result.strategy == "auto: cma" and result.history[0]["sigma"] == pytest.approx(2.0)
    ends = [r["end_step"] for r in result.restarts if r["end_step"] < result.steps]
    starts = [points[end - 1] for end in ends]
    assert len(starts) >= 2 and all(np.all(np.abs(s) <= 5.0) for s in starts)
    assert not any(np.allclose(s, x0) for s in starts)  # new points, not x0 again
    given = esbox.optimize(RASTRIGIN, x0, budget=600, seed=2, bounds=(-5, 5), sigma=0.5)
    assert given.history[0]["sigma"] == pytest.approx(0.5)  # a given sigma wins
    for bad in [(5, -5), (0, 0), (np.zeros(3), 1), (-np.inf, 1)]:
        with pytest.raises(ConfigError, match="bounds"):
            esbox.optimize(RASTRIGIN, x0, budget=600, bounds=bad)


def test_cma_restarts_on_pycmas_own_criteria_not_on_esbox_tolfun() -> None:
    """esbox's tolfun (the best so far, over k steps) would end a CMA-ES restart at once with
    k = 1; pycma's own criteria let it run until its samples' values converge."""
    x0 = RASTRIGIN.default_x0(6, seed=0)
    options = {"kind": "ipop", "tolfun_steps": 1}
    result = esbox.optimize(RASTRIGIN, x0, "cma", budget=4000, seed=1, restarts=options)
    assert result.restarts and all(r["steps"] > 20 for r in result.restarts)
    assert {r["reason"] for r in result.restarts} <= {
        "tolfun", "tolx", "tolstagnation", "tolflatfitness", "tolfunhist", "noeffectaxis",
        "noeffectcoord", "conditioncov", "tolupsigma",
    }  # fmt: skip
