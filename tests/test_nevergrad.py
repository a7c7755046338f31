"""nevergrad inside esbox (``ng:NAME`` strategies) and esbox inside nevergrad (``ESBox_*``).

The registry-wide contract tests also run ``ng:NGOpt`` (tests/conftest.py); these pin what is
particular to explicit candidates: the same search as nevergrad's own, resume by replay, the
errors, the CLI, and nevergrad's optimize, ask/tell and benchmark harness over esbox strategies.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import nevergrad as ng
import numpy as np
import pytest
import torch
from click.testing import CliRunner

import esbox
from esbox.adapters.models.space import TorchModuleSpace
from esbox.adapters.nevergrad import register
from esbox.adapters.nevergrad.optimizer import ESBox
from esbox.cli.main import cli
from esbox.errors import ConfigError, ResumeError
from esbox.space import VectorSpace
from esbox.specs import Perturbation, Update
from esbox.tracking import read_metrics

D = 8
X0 = np.linspace(-2.0, 3.0, D)


def sphere(x: np.ndarray) -> float:
    return float(np.sum((x - 0.5) ** 2))


def ask_tell(es, space: VectorSpace, steps: int, fn=sphere) -> list[np.ndarray]:
    """The esbox loop by hand; returns every point evaluated."""
    points = []
    for _ in range(steps):
        members = es.ask()
        batch = [space.materialize(p) for p in members]
        points += batch
        space.apply(es.tell([-fn(x) for x in batch]))
    return points


# == nevergrad inside esbox ======================================================================
@pytest.mark.parametrize("name", ["OnePlusOne", "DiagonalCMA", "TwoPointsDE"])
def test_the_search_is_nevergrads_own_from_the_same_start(name: str) -> None:
    """Same points as nevergrad run on an Array at x0 with the same seeding, and the final
    parameters are its recommendation (up to the rounding of adding displacements)."""
    space = VectorSpace(X0)
    es = esbox.make_strategy(f"ng:{name}", space, seed=3, population=6, sigma=0.5)
    ours = ask_tell(es, space, 12)

    array = ng.p.Array(init=X0.copy()).set_mutation(sigma=0.5)
    array.random_state = np.random.RandomState(np.random.MT19937(np.random.SeedSequence(3)))
    optimizer = ng.optimizers.registry[name](parametrization=array, budget=None, num_workers=6)
    theirs = []
    for _ in range(12):
        asked = [optimizer.ask() for _ in range(6)]
        for candidate in asked:
            theirs.append(candidate.value.copy())
            optimizer.tell(candidate, sphere(candidate.value))
        recommended = optimizer.provide_recommendation().value
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=0, atol=1e-12)
    np.testing.assert_allclose(space.vector, recommended, rtol=0, atol=1e-12)
    assert sphere(space.vector) < sphere(X0)


def test_optimize_with_ng_reports_the_best_and_the_recommendation() -> None:
    result = esbox.optimize(sphere, X0, strategy="ng:NGOpt", budget=600, seed=1)
    assert result.stop_reason == "max_evaluations" and result.evaluations <= 600
    assert result.best_value == sphere(result.best_x) < 1e-3 * sphere(X0)
    assert sphere(result.x) < 1e-3 * sphere(X0)  # nevergrad's recommendation
    assert result.history[-1]["best_value"] == result.best_value


def test_one_candidate_a_step_moves_at_every_step() -> None:
    space = VectorSpace(X0)
    es = esbox.make_strategy("ng:OnePlusOne", space, seed=0, population=1)
    ask_tell(es, space, 150)
    assert sphere(space.vector) < 0.1 * sphere(X0)


def test_a_step_without_a_finite_reward_holds_and_tells_nevergrad_inf() -> None:
    space = VectorSpace(X0)
    es = esbox.make_strategy("ng:OnePlusOne", space, seed=0, population=4)
    ask_tell(es, space, 5)
    before = space.vector.copy()
    es.ask()
    assert space.apply(es.tell([np.nan] * 4)) == 0.0 and np.array_equal(space.vector, before)
    assert es.state_dict()["extra"]["losses"][-1] == [np.inf] * 4  # never mistaken for 0
    ask_tell(es, space, 5)
    assert sphere(space.vector) <= sphere(before)


def test_members_and_updates_are_explicit_and_cross_the_wire() -> None:
    es = esbox.make_strategy("ng:CMA", D, seed=2, population=4)
    members = es.ask()
    assert es.ask() == members  # asking again before tell returns the same population
    for i, p in enumerate(members):
        assert p.seed == i and p.scale == 1.0 and len(p.values) == D
        assert Perturbation(**json.loads(json.dumps(p.to_dict()))) == p
    update = es.tell([-sphere(X0 + np.array(p.values)) for p in members])
    assert update.terms == () and len(update.shift) == D
    assert Update.from_dict(json.loads(json.dumps(update.to_dict()))) == update
    seeded = Perturbation(0, 0, 7, 0.1)  # seed specs keep their wire format
    assert "values" not in seeded.to_dict() and not seeded.mirrors(members[0])


def test_a_space_realises_explicit_specs_chunk_by_chunk() -> None:
    values = np.random.default_rng(0).normal(size=10)
    for dtype in ("float64", "float32"):
        space = VectorSpace(np.arange(10.0), dtype=dtype, chunk_size=3)
        before = space.vector.copy()
        member = Perturbation(0, 0, 0, 1.0, values=tuple(values))
        expected = (before.astype(np.float64) + values).astype(dtype)
        assert np.array_equal(space.materialize(member), expected)
        assert np.array_equal(space.vector, before)  # restored exactly
        shown = np.concatenate([part.numpy() for _, part in space.noise(member)])
        assert np.array_equal(shown, values)
        norm = space.apply(Update(0, 0, (), 0.0, shift=tuple(values)))
        assert norm == pytest.approx(np.linalg.norm(values))
        assert np.array_equal(space.vector, expected)
    with pytest.raises(ValueError, match="3 values for a space of 10"):
        space.materialize(Perturbation(0, 0, 0, 1.0, values=(1.0, 2.0, 3.0)))
    with pytest.raises(ValueError, match="not both"):
        Update(0, 0, (esbox.specs.Term(1, 1.0),), 0.1, shift=(0.0,))


def interrupted_at(step: int):
    def callback(runner, metrics):
        if metrics["step"] + 1 == step:
            raise KeyboardInterrupt

    return callback


@pytest.mark.parametrize("name", ["ng:NGOpt", "ng:TwoPointsDE"])
def test_an_interrupted_run_resumes_bit_identically_by_replay(tmp_path: Path, name: str) -> None:
    options = {"seed": 4, "population": 6, "checkpoint_every": 3}
    straight = esbox.optimize(sphere, X0, name, budget=240, **options)
    with pytest.raises(KeyboardInterrupt):
        esbox.optimize(
            sphere,
            X0,
            name,
            budget=240,
            checkpoint_dir=tmp_path,
            callbacks=[interrupted_at(17)],
            **options,
        )
    checkpoint = tmp_path / (tmp_path / "latest").read_text()
    assert sorted(p.name for p in checkpoint.iterdir()) == ["state.json", "tensors.safetensors"]
    extra = json.loads((checkpoint / "state.json").read_text())["strategy"]["extra"]
    assert len(extra["losses"]) == 17 and extra["budget"] == 240  # the log nevergrad replays
    resumed = esbox.optimize(sphere, X0, name, budget=240, resume=tmp_path, **options)
    assert np.array_equal(resumed.x, straight.x)
    assert np.array_equal(resumed.best_x, straight.best_x)
    drop = ("wall_seconds",)
    rows = [
        [{k: v for k, v in r.items() if k not in drop} for r in h]
        for h in (resumed.history, straight.history)
    ]
    assert rows[0] == rows[1] and len(rows[0]) == 40


def test_resume_refuses_a_replay_that_differs(tmp_path: Path) -> None:
    run = {"seed": 1, "population": 4, "checkpoint_every": 3}
    esbox.optimize(sphere, X0, "ng:OnePlusOne", max_steps=6, checkpoint_dir=tmp_path, **run)
    state_file = tmp_path / (tmp_path / "latest").read_text() / "state.json"
    state = json.loads(state_file.read_text())
    state["strategy"]["extra"]["losses"][2][1] = -1e9  # a new best: not this run's log
    state_file.write_text(json.dumps(state))
    with pytest.raises(ResumeError, match="did not reproduce the checkpoint's candidates"):
        esbox.optimize(sphere, X0, "ng:OnePlusOne", max_steps=9, resume=tmp_path, **run)


def test_the_runs_budget_is_nevergrads_plan_unless_set() -> None:
    result = esbox.optimize(sphere, X0, "ng:NGOpt", max_steps=5, population=4)
    assert result.steps == 5
    es = esbox.make_strategy("ng:NGOpt", D, population=4)
    runner = esbox.Runner(
        VectorSpace(X0),
        es,
        esbox.FunctionEvaluator(sphere),
        esbox.Budget(max_evaluations=400, max_steps=30),
    )
    runner.run()
    assert es.state_dict()["extra"]["budget"] == 120  # 30 steps of 4 come first
    fixed = esbox.make_strategy("ng:NGOpt", D, population=4, ng_budget=50)
    fixed.plan_budget(esbox.Budget(max_evaluations=400))
    assert fixed.state_dict()["extra"]["budget"] == 50


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: esbox.make_strategy("ng:NGOptt", 3), ["'ng:NGOptt'", "did you mean 'ng:NGOpt'"]),
        (lambda: esbox.make_strategy("ngg:CMA", 3), ["unknown strategy 'ngg:CMA'", "ng:NAME"]),
        (lambda: esbox.make_strategy("ng:CMA", 20_001), ["20,001", "at most 10,000"]),
        (lambda: esbox.make_strategy("ng:CMA", 50, max_dimension=20), ["50", "at most 20"]),
        (
            lambda: esbox.make_strategy("ng:CMA", TorchModuleSpace(torch.nn.Linear(4, 3))),
            ["TorchModuleSpace of 15 parameters", "copes"],
        ),
        (lambda: esbox.make_strategy("ng:CMA", 3, optimizer="adam"), ["'optimizer'", "sgd"]),
        (lambda: esbox.make_strategy("ng:CMA", 3, momentum=0.9), ["'momentum'"]),
        (
            lambda: esbox.make_strategy("ng:CMA", 3, sigma={"kind": "cosine", "start": 1}),
            ["'sigma'", "no schedule"],
        ),
        (
            lambda: esbox.make_strategy("ng:CMA", 3, sigma={"kind": "adaptive", "target": 0.2}),
            ["'sigma'", "'target' does not apply"],
        ),
        (lambda: esbox.make_strategy("ng:CMA", 3, sigma=0.0), ["sigma"]),
        (lambda: esbox.make_strategy("ng:CMA", 3, ng_budget=0), ["ng_budget", ">= 1"]),
        (lambda: esbox.make_strategy("ng:NelderMead", 3), ["one candidate at a time"]),
        (
            lambda: esbox.make_strategy("ng:CMA", 3, population=1, shaping="zscore"),
            ["'shaping' must be raw with population 1"],
        ),
        (lambda: esbox.make_strategy("ng:NGOpt", 3).ask(), ["needs to know its budget"]),
    ],
)
def test_bad_input_names_what_is_wrong(build, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    for word in words:
        assert word in str(info.value)


def test_sigma_from_the_black_box_defaults_is_nevergrads_initial_step() -> None:
    es = esbox.make_strategy("ng:CMA", VectorSpace(X0))  # black-box defaults: adaptive sigma
    assert es.sigma(0) == 1.0 and es.options.population == 4 + int(3 * np.log(D))
    assert (
        esbox.make_strategy("ng:CMA", D, sigma={"kind": "adaptive", "initial": 0.3}).sigma(9) == 0.3
    )


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_esbox_strategies_lists_the_family_and_shows_one() -> None:
    listing = run_cli("strategies")
    assert "ng:NAME" in listing and "ng:NGOpt" in listing and "optimizer_names" in listing
    assert "ng_budget" in run_cli("strategies", "ng:DiagonalCMA")
    wrong = CliRunner().invoke(cli, ["strategies", "ng:DiagonalCMAA"])
    assert wrong.exit_code == 2 and "did you mean 'ng:DiagonalCMA'" in wrong.output
    assert len(importlib.import_module("esbox.strategies.nevergrad").optimizer_names()) > 100


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rastrigin-copes.yaml"


def test_cli_runs_the_rastrigin_example_with_ngopt_and_resumes_bit_identically(
    tmp_path: Path,
) -> None:
    """`esbox optimize --config examples/rastrigin-copes.yaml --strategy ng:NGOpt` (20 steps of
    64 on d=100), Ctrl-C after 9 steps, `esbox resume`: the same files as the straight run."""
    from esbox.cli.run import execute, prepare, read_config, resolve_config, write_config

    straight = tmp_path / "straight"
    budget = ["--set", "budget.max_evaluations=1280"]
    output = run_cli("optimize", "--config", str(EXAMPLE), "--strategy", "ng:NGOpt", *budget,
                     "--out", str(straight))  # fmt: skip
    assert "ng:NGOpt on rastrigin(d=100)" in output and "drops" in output  # CoPES's subspaces
    config = resolve_config(read_config(straight))  # the same run, as its config.yaml says
    session = prepare(config)
    apply, calls = session.problem.space.apply, []

    def apply_and_interrupt(update):
        if len(calls) == 9:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, held until the step ends
        calls.append(update)
        return apply(update)

    session.problem.space.apply = apply_and_interrupt
    out = tmp_path / "interrupted"
    out.mkdir()
    write_config(out, config)
    assert execute(session, out, quiet=True, resume=False)["status"] == "interrupted"
    run_cli("resume", "-q", str(out))
    for name in ("best.npy", "final.npy"):
        np.testing.assert_array_equal(np.load(out / name), np.load(straight / name))
    rows = [read_metrics(run / "metrics.jsonl") for run in (out, straight)]
    for row in (*rows[0], *rows[1]):
        row.pop("wall_seconds")
    assert rows[0] == rows[1] and len(rows[0]) == 20
    assert rows[0][-1]["best_value"] < rows[0][0]["best_value"]


# == esbox inside nevergrad ======================================================================
def shifted_sphere(x: np.ndarray) -> float:
    return float(np.sum((x - 1.5) ** 2))


def test_register_adds_every_strategy_once() -> None:
    names = register()
    assert {"ESBox_CoPES", "ESBox_OpenAIES", "ESBox_ESOpt"} <= set(names)
    assert register() == names  # again: harmless
    assert len(names) == len(esbox.available_strategies())


@pytest.mark.parametrize("name", ["ESBox_CoPES", "ESBox_OpenAIES", "ESBox_ESOpt"])
@pytest.mark.parametrize("num_workers", [1, 4])
def test_nevergrads_minimize_with_esbox_strategies(name: str, num_workers: int) -> None:
    register()
    array = ng.p.Array(shape=(2, 5))
    array.random_state = np.random.RandomState(0)
    optimizer = ng.optimizers.registry[name](array, budget=600, num_workers=num_workers)
    assert optimizer.strategy.options.population % num_workers == 0
    recommended = optimizer.minimize(shifted_sphere).value
    assert recommended.shape == (2, 5)
    assert shifted_sphere(recommended) < 0.01 * shifted_sphere(np.zeros((2, 5)))


def test_ask_tell_in_batches_and_spare_workers_evaluate_the_mean() -> None:
    register()
    array = ng.p.Array(shape=(6,))
    array.random_state = np.random.RandomState(1)
    family = ESBox(strategy="openai_es", options={"population": 4})
    optimizer = family(array, budget=100, num_workers=6)
    asked = [optimizer.ask() for _ in range(6)]
    mean = optimizer.provide_recommendation().value
    assert [np.array_equal(c.value, mean) for c in asked] == [False] * 4 + [True] * 2
    for candidate in reversed(asked):  # out of order
        optimizer.tell(candidate, shifted_sphere(candidate.value))
    assert optimizer.strategy.step == 1
    assert not np.array_equal(optimizer.provide_recommendation().value, mean)


def test_seeded_parametrizations_give_the_same_run() -> None:
    register()

    def run() -> np.ndarray:
        array = ng.p.Array(shape=(5,))
        array.random_state = np.random.RandomState(7)
        return ng.optimizers.registry["ESBox_CoPES"](array, budget=200).minimize(sphere).value

    assert np.array_equal(run(), run())


def test_bounds_act_through_nevergrads_transform_and_other_parametrizations_are_refused() -> None:
    register()
    array = ng.p.Array(shape=(4,)).set_bounds(-1.0, 1.0)
    array.random_state = np.random.RandomState(0)
    optimizer = ng.optimizers.registry["ESBox_CoPES"](array, budget=300)
    best = optimizer.minimize(shifted_sphere).value
    assert np.all(np.abs(best) <= 1.0) and shifted_sphere(best) < 1.1  # the corner (1, 1, 1, 1)
    with pytest.raises(TypeError, match=r"ng\.p\.Array .* got Instrumentation"):
        ng.optimizers.registry["ESBox_CoPES"](ng.p.Instrumentation(ng.p.Scalar()), budget=10)
    optimizer = ng.optimizers.registry["ESBox_CoPES"](3, budget=10)
    with pytest.raises(ng.errors.TellNotAskedNotSupportedError, match="members it asked"):
        optimizer.tell(optimizer.parametrization.spawn_child(new_value=np.ones(3)), 1.0)


@pytest.fixture
def experiment_class(monkeypatch: pytest.MonkeyPatch) -> type:
    """nevergrad's benchmark ``Experiment``. Importing ``nevergrad.benchmark`` runs every
    experiment family (images need torchvision, which the CPU torch here lacks), so without
    them the harness module is loaded alone, its package left uninitialised for this test."""
    try:
        from nevergrad.benchmark import Experiment
    except ModuleNotFoundError:
        folder = Path(ng.__file__).parent / "benchmark"
        spec = importlib.util.spec_from_file_location(
            "nevergrad.benchmark", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        monkeypatch.setitem(
            sys.modules, "nevergrad.benchmark", importlib.util.module_from_spec(spec)
        )
        monkeypatch.delitem(sys.modules, "nevergrad.benchmark.xpbase", raising=False)
        Experiment = importlib.import_module("nevergrad.benchmark.xpbase").Experiment
    return Experiment


def test_nevergrads_benchmark_harness_runs_esbox_and_a_baseline(experiment_class) -> None:
    from nevergrad.functions import ArtificialFunction

    register()
    np.random.seed(0)  # the function's random translation
    function = ArtificialFunction("sphere", block_dimension=10)
    start = function(np.zeros(10))
    results = {}
    for name in ("ESBox_CoPES", "ESBox_OpenAIES", "ESBox_ESOpt", "CMA"):
        result = experiment_class(function, name, budget=400, num_workers=4).run()
        assert result["error"] == "" and result["elapsed_budget"] == 400, result
        results[name] = result["loss"]
    assert all(results[name] < 0.01 * start for name in results if name.startswith("ESBox"))
    assert results["CMA"] < start
