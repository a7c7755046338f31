"""Equal budgets: ``budget.max_cpu_seconds`` stops a run on this process's CPU clock, which
survives a resume; ``--budget-from RUN`` gives a run the compute another run spent."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from esbox import Budget, FunctionEvaluator, Runner, VectorSpace, make_strategy
from esbox.cli.main import cli


def busy_sphere(x: np.ndarray) -> float:
    """The sphere, after 2 ms of CPU work, so that a CPU budget is reached in a few steps."""
    end = time.process_time() + 0.002
    while time.process_time() < end:
        pass
    return float(np.dot(x, x))


def make_runner(checkpoint_dir: Path, budget: Budget) -> Runner:
    space = VectorSpace(np.ones(5))
    es = make_strategy("openai_es", space, seed=0, population=4, sigma=0.1, learning_rate=0.05)
    return Runner(space, es, FunctionEvaluator(busy_sphere), budget,
                  checkpoint_dir=checkpoint_dir, checkpoint_every=1)  # fmt: skip


def test_max_cpu_seconds_stops_the_run_and_its_clock_survives_a_resume(tmp_path) -> None:
    first = make_runner(tmp_path, Budget(max_cpu_seconds=0.1))
    assert first.run() == "max_cpu_seconds"
    spent = first.cpu_seconds()
    assert 0.1 <= spent < 0.5 and first.strategy.step >= 5  # 4 members x 2 ms a step
    again = make_runner(tmp_path, Budget(max_cpu_seconds=0.1))
    again.resume(tmp_path)
    assert again.cpu_seconds() == pytest.approx(spent, abs=0.02)  # restored, not restarted at 0
    assert again.run() == "max_cpu_seconds" and again.strategy.step == first.strategy.step
    longer = make_runner(tmp_path, Budget(max_cpu_seconds=spent + 0.1))
    longer.resume(tmp_path)
    assert longer.run() == "max_cpu_seconds" and longer.strategy.step > first.strategy.step


def test_the_cpu_clock_counts_only_time_in_run(tmp_path) -> None:
    runner = make_runner(tmp_path, Budget(max_steps=2))
    busy_sphere(np.zeros(1))  # before run: not the run's time
    assert runner.cpu_seconds() == 0.0
    runner.run()
    after = runner.cpu_seconds()
    time.sleep(0.01)
    assert after > 0 and runner.cpu_seconds() == after  # stopped with the run


def write_run(directory: Path, rows: list[dict], device: str = "cpu") -> Path:
    """A finished run directory as esbox writes one: config.yaml and metrics.jsonl."""
    directory.mkdir(parents=True)
    config = {"strategy": "grpo", "problem": {"kind": "llm", "device": device}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    lines = (json.dumps({"step": i, "evaluations": i + 1, **row}) for i, row in enumerate(rows))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


REFERENCE = [
    {"cpu_seconds": 10.0, "wall_seconds": 6.0},
    {"cpu_seconds": 20.0, "wall_seconds": 12.0, "val_accuracy": 0.5},
    {"cpu_seconds": 30.0, "wall_seconds": 18.0, "val_accuracy": 0.75},
    {"cpu_seconds": 40.0, "wall_seconds": 24.0, "val_accuracy": 0.75},
    {"cpu_seconds": 50.0, "wall_seconds": 30.0, "val_accuracy": 0.25},
]


def dry_run(*args: str):
    return CliRunner().invoke(cli, ["optimize", "--dry-run", *args])


def budget_of(output: str) -> dict:
    return yaml.safe_load(output)["budget"]


@pytest.mark.parametrize(("at", "seconds"), [("end", 50.0), ("best", 30.0)])
def test_budget_from_takes_the_cpu_seconds_to_the_end_or_to_the_best_accuracy(
    tmp_path, at, seconds
) -> None:
    reference = write_run(tmp_path / "grpo", REFERENCE)
    result = dry_run("--budget-from", str(reference), "--budget-at", at)
    assert result.exit_code == 0, result.output
    budget = budget_of(result.stdout)
    assert budget["max_cpu_seconds"] == seconds  # the first of the best, the paper's checkpoint
    assert budget["max_evaluations"] is None and budget["max_steps"] is None
    assert budget["max_seconds"] is None


def test_a_set_budget_after_budget_from_adds_a_cap(tmp_path) -> None:
    reference = write_run(tmp_path / "grpo", REFERENCE)
    result = dry_run("--budget-from", str(reference), "--set", "budget.max_steps=7")
    assert result.exit_code == 0, result.output
    budget = budget_of(result.stdout)
    assert budget["max_steps"] == 7 and budget["max_cpu_seconds"] == 50.0


def test_a_gpu_run_gives_its_wall_seconds_and_only_to_a_gpu_run(tmp_path) -> None:
    reference = write_run(tmp_path / "grpo", REFERENCE, device="cuda")
    refused = dry_run("--budget-from", str(reference))
    assert refused.exit_code == 2 and "ran on a GPU and this one runs on a CPU" in refused.output
    on_gpu = ["problem.kind=llm", "problem.device=cuda", "problem.task.kind=arithmetic"]
    result = dry_run("--budget-from", str(reference), *(f"--set={s}" for s in on_gpu))
    assert "budget.max_seconds = 30.0" in result.output  # checked before the model is needed


@pytest.mark.parametrize(
    ("rows", "args", "named"),
    [
        ([{"wall_seconds": 1.0}], (), "logged no cpu_seconds"),
        ([{"cpu_seconds": 1.0}], ("--budget-at", "best"), "logged no held-out accuracy"),
    ],
)
def test_budget_from_a_run_without_the_figure_names_what_is_missing(
    tmp_path, rows, args, named
) -> None:
    reference = write_run(tmp_path / "old", rows)
    result = dry_run("--budget-from", str(reference), *args)
    assert result.exit_code == 2 and named in result.output


def test_budget_from_a_missing_run_is_a_clear_error(tmp_path) -> None:
    result = dry_run("--budget-from", str(tmp_path / "nowhere"))
    assert result.exit_code == 2 and "does not exist" in result.output


def test_esbox_grpo_takes_budget_from_an_es_run(tmp_path) -> None:
    pytest.importorskip("trl")
    from esbox.adapters.models.testing import save_tiny_lm

    reference = write_run(tmp_path / "copes", REFERENCE)
    model = save_tiny_lm(tmp_path / "tiny")
    config = {"problem": {"kind": "llm", "model": str(model), "task": {"kind": "arithmetic"}},
              "budget": {"max_steps": 3}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(
        cli, ["grpo", "-c", str(tmp_path / "c.yaml"), "--budget-from", str(reference), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert budget_of(result.stdout)["max_cpu_seconds"] == 50.0
    assert budget_of(result.stdout)["max_steps"] is None
