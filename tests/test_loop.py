"""The loop: ``esbox.optimize``, budgets, callbacks, batching, failures, checkpoints, resume."""

from __future__ import annotations

import json
import os
import signal
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

import esbox
from esbox import checkpoint as ckpt
from esbox.errors import ConfigError, ResumeError
from esbox.evaluation import FunctionEvaluator
from esbox.runner import Budget, Runner
from esbox.space import VectorSpace

D = 10
OPTIONS = {"population": 8, "sigma": 0.1, "learning_rate": 0.05}
STRATEGY_OPTIONS = {"copes": {"subspaces": 2}, "ng:NGOpt": {"ng_budget": 800}}


def sphere(x: np.ndarray) -> float:
    return float(np.sum(np.asarray(x) ** 2))


def batched_sphere(x: np.ndarray) -> np.ndarray:
    assert x.ndim == 2
    return np.sum(x**2, axis=1)


def options(name: str, **overrides) -> dict:
    return {**OPTIONS, **STRATEGY_OPTIONS.get(name, {}), **overrides}


def x0() -> np.ndarray:
    return np.linspace(-1.0, 2.0, D)


def same_result(a: esbox.Result, b: esbox.Result) -> None:
    """Bit-identical outcome; only wall-clock fields may differ."""
    assert np.array_equal(a.x, b.x)
    assert np.array_equal(a.best_x, b.best_x)
    assert a.best_value == b.best_value
    assert (a.evaluations, a.steps) == (b.evaluations, b.steps)

    def strip(history):
        return [{k: v for k, v in h.items() if k != "wall_seconds"} for h in history]

    assert strip(a.history) == strip(b.history)


# -- optimize -----------------------------------------------------------------------------------
def test_optimize_returns_what_happened() -> None:
    result = esbox.optimize(sphere, x0(), "openai_es", budget=200, seed=1, **OPTIONS)
    assert isinstance(result, esbox.Result)
    assert result.stop_reason == "max_evaluations"
    assert result.evaluations == 200 and result.steps == 25
    assert len(result.history) == 25
    assert [h["evaluations"] for h in result.history] == list(range(8, 201, 8))
    assert result.best_value < sphere(x0())
    assert sphere(result.best_x) == result.best_value
    assert sphere(result.x) < sphere(x0())
    assert result.x.shape == (D,) and result.x.dtype == np.float64


def test_evaluation_budget_is_never_exceeded() -> None:
    result = esbox.optimize(sphere, x0(), "openai_es", budget=30, **OPTIONS)
    assert result.evaluations == 24  # a fourth step of 8 would overshoot
    assert result.stop_reason == "max_evaluations"


def test_step_budget() -> None:
    result = esbox.optimize(sphere, x0(), "copes", max_steps=7, **options("copes"))
    assert (result.steps, result.evaluations, result.stop_reason) == (7, 56, "max_steps")


def test_time_budget() -> None:
    def slow(x):
        time.sleep(0.002)
        return sphere(x)

    start = time.perf_counter()
    result = esbox.optimize(slow, x0(), "openai_es", max_time=0.15, **OPTIONS)
    assert result.stop_reason == "max_seconds"
    assert result.steps >= 1
    assert time.perf_counter() - start < 5.0
    assert result.history[-1]["wall_seconds"] >= 0.15


def test_first_exhausted_budget_wins() -> None:
    result = esbox.optimize(sphere, x0(), "openai_es", budget=1000, max_steps=3, **OPTIONS)
    assert result.stop_reason == "max_steps"
    budget = Budget(max_evaluations=16, max_steps=100)
    result = esbox.optimize(sphere, x0(), "openai_es", budget=budget, **OPTIONS)
    assert (result.stop_reason, result.steps) == ("max_evaluations", 2)


@pytest.mark.parametrize(
    "kwargs", [{}, {"max_evaluations": 0}, {"max_steps": -1}, {"max_seconds": 0.0}]
)
def test_bad_budgets_are_config_errors(kwargs) -> None:
    with pytest.raises(ConfigError, match="budget"):
        Budget(**kwargs)


def test_optimize_without_a_budget_is_refused() -> None:
    with pytest.raises(ConfigError, match="budget"):
        esbox.optimize(sphere, x0(), "openai_es", **OPTIONS)


def test_unknown_strategy_in_optimize_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="openai_es"):
        esbox.optimize(sphere, x0(), "cma_es", budget=10)


def test_maximize_is_minimize_of_the_negation() -> None:
    low = esbox.optimize(sphere, x0(), "copes", budget=160, seed=3, **options("copes"))
    high = esbox.optimize(
        lambda x: -sphere(x), x0(), "copes", budget=160, seed=3, minimize=False, **options("copes")
    )
    assert np.array_equal(low.x, high.x)
    assert high.best_value == -low.best_value


def test_manual_ask_tell_loop_equals_optimize(strategy_name: str) -> None:
    """The documented ask/tell loop with make_strategy reproduces optimize bit for bit."""
    opts = options(strategy_name)
    result = esbox.optimize(sphere, x0(), strategy_name, max_steps=4, seed=2, **opts)
    space = VectorSpace(x0())
    es = esbox.make_strategy(strategy_name, space, seed=2, **opts)
    for _ in range(4):
        members = es.ask()
        costs = []
        for p in members:
            with space.perturbed(p):
                costs.append(sphere(space.vector))
        space.apply(es.tell(-np.array(costs)))
    assert np.array_equal(space.vector, result.x)


def test_float32_runs_stay_float32() -> None:
    result = esbox.optimize(sphere, x0(), "openai_es", max_steps=5, dtype="float32", **OPTIONS)
    assert result.x.dtype == np.float32 and result.best_x.dtype == np.float32
    assert result.best_value < sphere(x0())


# -- callbacks ----------------------------------------------------------------------------------
def test_callbacks_run_once_per_step_with_metrics() -> None:
    seen = []

    def callback(runner: Runner, metrics: dict) -> None:
        seen.append((runner.strategy.step, runner.evaluations, dict(metrics)))

    result = esbox.optimize(
        sphere, x0(), "openai_es", max_steps=4, callbacks=[callback, lambda r, m: None], **OPTIONS
    )
    assert [s[:2] for s in seen] == [(1, 8), (2, 16), (3, 24), (4, 32)]
    for _, _, metrics in seen:
        for key in ("step", "sigma", "reward_mean", "best_value", "update_norm", "evaluations"):
            assert key in metrics
    assert seen[-1][2] == result.history[-1]


def test_a_callback_returning_true_stops_the_run() -> None:
    result = esbox.optimize(
        sphere, x0(), "openai_es", budget=10_000, callbacks=[lambda r, m: m["step"] == 2], **OPTIONS
    )
    assert (result.stop_reason, result.steps) == ("callback", 3)


# -- batched functions ---------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [3, 8, 64])
def test_batched_function_gives_the_same_run(strategy_name: str, batch_size: int) -> None:
    calls = []

    def fn(x):
        calls.append(x.shape)
        return batched_sphere(x)

    opts = options(strategy_name)
    one = esbox.optimize(sphere, x0(), strategy_name, max_steps=3, seed=4, **opts)
    many = esbox.optimize(
        fn, x0(), strategy_name, max_steps=3, seed=4, batched=True, batch_size=batch_size, **opts
    )
    same_result(one, many)
    per_step = -(-8 // batch_size)
    assert len(calls) == 3 * per_step
    assert all(shape[1] == D and shape[0] <= batch_size for shape in calls)


def test_batched_function_returning_the_wrong_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="returned 1 values for 8 inputs"):
        esbox.optimize(lambda x: 0.0, x0(), "openai_es", max_steps=1, batched=True, **OPTIONS)


def test_vector_valued_function_without_batched_is_an_error() -> None:
    with pytest.raises(ValueError, match="batched=True"):
        esbox.optimize(lambda x: x, x0(), "openai_es", max_steps=1, **OPTIONS)


def test_nonfinite_values_do_not_poison_the_run() -> None:
    def flaky(x):
        return float("nan") if x[0] > -1.0 else sphere(x)  # about half the members

    result = esbox.optimize(flaky, x0(), "openai_es", max_steps=5, **OPTIONS)
    assert np.all(np.isfinite(result.x))
    assert np.isfinite(result.best_value)
    assert sum(h["nonfinite_rewards"] for h in result.history) > 0


# -- failures mid-population ---------------------------------------------------------------------
@pytest.mark.parametrize("batched", [False, True])
def test_evaluator_raising_mid_population_leaves_parameters_bit_identical(
    strategy_name: str, batched: bool
) -> None:
    calls = {"n": 0}

    def fn(x):
        calls["n"] += 1
        if calls["n"] == 13:
            raise RuntimeError("rollout crashed")
        return batched_sphere(x) if batched else sphere(x)

    space = VectorSpace(x0())
    es = esbox.make_strategy(strategy_name, space, **options(strategy_name))
    evaluator = FunctionEvaluator(fn, batched=batched, batch_size=1)
    runner = Runner(space, es, evaluator, Budget(max_steps=5))
    runner.step()
    before = space.vector.copy()
    with pytest.raises(RuntimeError, match="rollout crashed"):
        runner.step()
    assert np.array_equal(space.vector, before)
    assert es.step == 1 and runner.evaluations == 8
    # the step can be retried: the same population is still pending
    runner.step()
    reference = esbox.optimize(sphere, x0(), strategy_name, max_steps=2, **options(strategy_name))
    assert np.array_equal(space.vector, reference.x)


# -- checkpoints and resume -----------------------------------------------------------------------
def resume_case(strategy_name: str, tmp_path: Path, stop: int, total: int, **extra):
    opts = options(strategy_name, **extra)
    full = esbox.optimize(sphere, x0(), strategy_name, max_steps=total, seed=5, **opts)
    first = esbox.optimize(
        sphere,
        x0(),
        strategy_name,
        max_steps=stop,
        seed=5,
        checkpoint_dir=tmp_path,
        checkpoint_every=2,
        **opts,
    )
    assert first.steps == stop
    resumed = esbox.optimize(
        sphere, x0(), strategy_name, max_steps=total, seed=5, resume=tmp_path, **opts
    )
    return full, resumed


def test_resume_is_bit_identical_to_an_uninterrupted_run(strategy_name: str, tmp_path) -> None:
    full, resumed = resume_case(strategy_name, tmp_path, stop=3, total=7)
    same_result(full, resumed)


@pytest.mark.parametrize(
    "extra",
    [{"optimizer": "adam"}, {"optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.01}],
    ids=["adam", "momentum"],
)
def test_resume_restores_optimizer_state(tmp_path, extra) -> None:
    full, resumed = resume_case("openai_es", tmp_path, stop=4, total=8, **extra)
    same_result(full, resumed)


def test_resume_with_an_evaluation_budget(tmp_path) -> None:
    """An evaluation budget stops with an ask pending; the pending ask is resumed too."""
    opts = options("copes")
    full = esbox.optimize(sphere, x0(), "copes", budget=80, seed=1, **opts)
    esbox.optimize(sphere, x0(), "copes", budget=30, seed=1, checkpoint_dir=tmp_path, **opts)
    resumed = esbox.optimize(sphere, x0(), "copes", budget=80, seed=1, resume=tmp_path, **opts)
    same_result(full, resumed)


def test_resume_after_an_interrupt(tmp_path) -> None:
    """Ctrl-C writes a checkpoint; resuming from it ends where an uninterrupted run ends."""

    def interrupt(runner, metrics):
        if metrics["step"] == 2:
            raise KeyboardInterrupt

    opts = options("copes")
    full = esbox.optimize(sphere, x0(), "copes", max_steps=6, seed=8, **opts)
    with pytest.raises(KeyboardInterrupt):
        esbox.optimize(
            sphere,
            x0(),
            "copes",
            max_steps=6,
            seed=8,
            callbacks=[interrupt],
            checkpoint_dir=tmp_path,
            checkpoint_every=100,
            **opts,
        )
    assert (tmp_path / "step-00000003").is_dir()
    resumed = esbox.optimize(sphere, x0(), "copes", max_steps=6, seed=8, resume=tmp_path, **opts)
    same_result(full, resumed)


def test_resume_after_an_interrupt_mid_population(tmp_path) -> None:
    """Ctrl-C inside an evaluation: the pending population is saved and re-evaluated."""
    calls = {"n": 0}

    def interrupted(x):
        calls["n"] += 1
        if calls["n"] == 21:  # the fifth member of the third step
            raise KeyboardInterrupt
        return sphere(x)

    opts = options("openai_es", optimizer="adam")
    full = esbox.optimize(sphere, x0(), "openai_es", max_steps=5, seed=3, **opts)
    with pytest.raises(KeyboardInterrupt):
        esbox.optimize(
            interrupted, x0(), "openai_es", max_steps=5, seed=3, checkpoint_dir=tmp_path,
            checkpoint_every=100, **opts,
        )  # fmt: skip
    state = json.loads((ckpt.latest_checkpoint(tmp_path) / "state.json").read_text())
    assert state["strategy"]["step"] == 2 and state["strategy"]["pending"] is not None
    resumed = esbox.optimize(
        sphere, x0(), "openai_es", max_steps=5, seed=3, resume=tmp_path, **opts
    )
    same_result(full, resumed)


def test_resume_float32_batched(tmp_path) -> None:
    opts = options("esopt")
    kw = {"dtype": "float32", "batched": True, "batch_size": 3, "seed": 2}
    full = esbox.optimize(batched_sphere, x0(), "esopt", max_steps=6, **kw, **opts)
    esbox.optimize(
        batched_sphere, x0(), "esopt", max_steps=2, checkpoint_dir=tmp_path, **kw, **opts
    )
    resumed = esbox.optimize(
        batched_sphere, x0(), "esopt", max_steps=6, resume=tmp_path, **kw, **opts
    )
    assert resumed.x.dtype == np.float32
    same_result(full, resumed)


def test_a_fresh_run_in_a_used_directory_does_not_inherit_its_history(tmp_path) -> None:
    """Re-running into the same checkpoint directory, then resuming, gives this run's history."""
    esbox.optimize(
        sphere, x0(), "openai_es", max_steps=4, seed=1, checkpoint_dir=tmp_path,
        checkpoint_every=1, **OPTIONS,
    )  # fmt: skip
    full = esbox.optimize(sphere, x0(), "openai_es", max_steps=4, seed=2, **OPTIONS)
    esbox.optimize(
        sphere, x0(), "openai_es", max_steps=2, seed=2, checkpoint_dir=tmp_path,
        checkpoint_every=1, **OPTIONS,
    )  # fmt: skip
    resumed = esbox.optimize(
        sphere, x0(), "openai_es", max_steps=4, seed=2, resume=tmp_path, **OPTIONS
    )
    same_result(full, resumed)


def test_sigint_during_an_update_is_held_until_it_is_applied(tmp_path) -> None:
    """Ctrl-C while an update is applied lands after it: the checkpoint is a whole step."""
    opts = options("copes", restarts="none")  # the Runner below runs the bare strategy
    full = esbox.optimize(sphere, x0(), "copes", max_steps=6, seed=4, **opts)
    space = VectorSpace(x0())
    es = esbox.make_strategy("copes", space, seed=4, **options("copes"))
    apply = space.apply

    def apply_with_sigint(update):
        if update.step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return apply(update)

    space.apply = apply_with_sigint
    runner = Runner(
        space, es, FunctionEvaluator(sphere), Budget(max_steps=6), checkpoint_dir=tmp_path,
        checkpoint_every=100,
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert es.step == 3 and runner.evaluations == 24 and len(runner.history) == 3
    assert ckpt.latest_checkpoint(tmp_path).name == "step-00000003"
    resumed = esbox.optimize(sphere, x0(), "copes", max_steps=6, seed=4, resume=tmp_path, **opts)
    same_result(full, resumed)


def test_checkpoint_files_are_safetensors_and_json(tmp_path) -> None:
    esbox.optimize(
        sphere,
        x0(),
        "openai_es",
        max_steps=6,
        checkpoint_dir=tmp_path,
        checkpoint_every=2,
        optimizer="adam",
        **OPTIONS,
    )
    assert (tmp_path / "latest").read_text().strip() == "step-00000006"
    steps = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert steps == ["step-00000002", "step-00000004", "step-00000006"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers
    folder = tmp_path / "step-00000006"
    assert sorted(p.name for p in folder.iterdir()) == ["state.json", "tensors.safetensors"]
    raw = (folder / "tensors.safetensors").read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + header_len])  # plain safetensors header, no pickle
    assert "param.0" in header
    with safe_open(str(folder / "tensors.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("param.0").shape == (D,)
    assert {"param.0", "optimizer.adam_m.0", "optimizer.adam_v.0", "optimizer_steps"} <= keys
    state = json.loads((folder / "state.json").read_text())
    assert state["strategy"]["step"] == 6 and state["strategy"]["name"] == "openai_es"
    assert state["runner"]["evaluations"] == 48
    assert len(state["next_seeds"]) > 0


def test_keep_checkpoints_prunes_old_ones(tmp_path) -> None:
    space = VectorSpace(x0())
    es = esbox.make_strategy("openai_es", space, **OPTIONS)
    runner = Runner(
        space,
        es,
        FunctionEvaluator(sphere),
        Budget(max_steps=5),
        checkpoint_dir=tmp_path,
        checkpoint_every=1,
        keep_checkpoints=2,
    )
    runner.run()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000004", "step-00000005"]


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    opts = options("copes")
    esbox.optimize(
        sphere, x0(), "copes", max_steps=2, checkpoint_dir=tmp_path, checkpoint_every=2, **opts
    )
    before = ckpt.load_checkpoint(tmp_path)

    def broken_save(tensors, path):
        Path(path).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        esbox.optimize(
            sphere,
            x0(),
            "copes",
            max_steps=4,
            resume=tmp_path,
            checkpoint_every=2,
            **opts,
        )
    monkeypatch.undo()
    assert (tmp_path / "latest").read_text().strip() == "step-00000002"
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["history.jsonl", "latest", "step-00000002"]
    after = ckpt.load_checkpoint(tmp_path)
    assert after[1] == before[1]
    assert all(np.array_equal(after[0][k], before[0][k]) for k in before[0])


def test_latest_falls_back_to_the_newest_complete_checkpoint(tmp_path) -> None:
    esbox.optimize(
        sphere, x0(), "openai_es", max_steps=4, checkpoint_dir=tmp_path, checkpoint_every=2,
        **OPTIONS,
    )  # fmt: skip
    (tmp_path / "latest").write_text("step-99999999")  # points at nothing
    (tmp_path / "step-00000009").mkdir()  # incomplete: no state.json
    assert ckpt.latest_checkpoint(tmp_path).name == "step-00000004"
    (tmp_path / "latest").unlink()
    assert ckpt.latest_checkpoint(tmp_path).name == "step-00000004"


def test_resume_from_an_empty_directory_is_an_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        esbox.optimize(sphere, x0(), "openai_es", max_steps=2, resume=tmp_path, **OPTIONS)


@pytest.fixture
def written(tmp_path) -> Path:
    esbox.optimize(
        sphere, x0(), "copes", max_steps=2, seed=5, checkpoint_dir=tmp_path, checkpoint_every=1,
        **options("copes"),
    )  # fmt: skip
    return tmp_path


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"seed": 6}, "seed"),
        ({"strategy": "openai_es"}, "name"),
        ({"sigma": 0.2}, "options"),
        ({"subspaces": 4}, "options"),
        ({"x0": np.zeros(D + 1)}, "dimension"),
    ],
    ids=["seed", "strategy", "sigma", "subspaces", "dimension"],
)
def test_resume_refuses_a_mismatched_run(written: Path, change: dict, match: str) -> None:
    kwargs = {"strategy": "copes", "seed": 5, "x0": x0(), **options("copes")}
    kwargs.update(change)
    if kwargs["strategy"] == "openai_es":
        kwargs.pop("subspaces")
    fn = kwargs.pop("fn", sphere)
    with pytest.raises(ResumeError, match=match):
        esbox.optimize(fn, max_steps=4, resume=written, **kwargs)


def test_resume_refuses_a_seed_stream_that_does_not_match(written: Path) -> None:
    folder = ckpt.latest_checkpoint(written)
    state = json.loads((folder / "state.json").read_text())
    state["next_seeds"][0] += 1
    (folder / "state.json").write_text(json.dumps(state))
    with pytest.raises(ResumeError, match="seed stream"):
        esbox.optimize(
            sphere, x0(), "copes", max_steps=4, seed=5, resume=written, **options("copes")
        )
