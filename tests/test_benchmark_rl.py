"""``python -m benchmarks rl``: the fair-comparison protocol (tuning on the validation split,
chosen setting with new seeds at equal CPU time, paired statistics on held-out questions) on
a tiny model, and its report's arithmetic on made-up scores."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks`` is not installed: it imports from the repository root."""
    monkeypatch.syspath_prepend(str(ROOT))


def made_up_result(tmp_path: Path) -> dict:
    """Base right on questions 0-1 of 4; ES seeds add question 2 (one seed) or 2 and 3; GRPO
    adds 2 and 3 and loses 0."""
    from benchmarks.rl import Run

    def run(method: str, seed: int, accuracy: float) -> Run:
        results = {
            "validation_accuracy": accuracy,
            "steps": 3,
            "samples": 12,
            "cpu_seconds": 60.0,
            "peak_rss_mib": 100.0,
            "stop_reason": "max_cpu_seconds",
        }
        return Run(
            "toy", method, {"lr": accuracy}, seed, tmp_path / f"{method}{seed}", "c.yaml", results
        )

    tuning = [run("copes", 0, 0.2), run("copes", 0, 0.6), run("grpo", 0, 0.5)]
    finals = [run("copes", 1, 0), run("copes", 2, 0), run("grpo", 1, 0)]
    greedy = {
        finals[0].directory: [1, 1, 1, 0],
        finals[1].directory: [1, 1, 1, 1],
        finals[2].directory: [0, 1, 1, 1],
    }
    scores = {d: {"greedy": g, "figures": {"pass@1": 0.5}} for d, g in greedy.items()}
    return {
        "task": "toy",
        "tuning": tuning,
        "finals": finals,
        "base": {"greedy": [1, 1, 0, 0], "figures": {"pass@1": 0.25}},
        "scores": scores,
        "chosen": {"copes": tuning[1], "grpo": tuning[2]},
    }


def test_the_report_pairs_questions_and_divides_by_grpos_gain(tmp_path) -> None:
    from benchmarks.rl_report import report

    args = Namespace(samples=1, tuning=3, seeds=2, validation=5, heldout=4, cpu_minutes=1.0)
    text, tables = report(made_up_result(tmp_path), ["copes", "grpo"], args)
    headers, rows = tables["rl_toy"]
    row = {r[0]: dict(zip(headers, r, strict=True)) for r in rows}
    # copes: per question 1, 1, 1, 0.5 -> 0.875; against the base 0, 0, 1, 0.5
    assert row["copes"]["held-out accuracy"] == "0.875"
    differences = [0, 0, 1, 0.5]
    se = math.sqrt(sum((d - 0.375) ** 2 for d in differences) / 3) / 2
    assert row["copes"]["change vs base (paired SE)"] == f"+0.375 ± {se:.3f}"
    assert row["copes"]["questions gained / lost"] == "2 / 0"
    assert row["grpo"]["change vs base (paired SE)"].startswith("+0.250")
    assert row["grpo"]["questions gained / lost"] == "2 / 1"
    assert row["copes"]["fraction of GRPO's gain"] == "150%"  # 0.375 / 0.25
    tuning = tables["rl_toy_tuning"][1]
    assert [r[-1] for r in tuning] == ["", "**chosen**", "**chosen**"]
    assert "Not a result" not in text and "Not at equal CPU time" not in text


@pytest.mark.parametrize(("clock", "key"), [("cpu", "max_cpu_seconds"), ("wall", "max_seconds")])
def test_every_run_stops_at_the_budget_of_its_clock_and_nothing_else(tmp_path, clock, key):
    from benchmarks.rl import Run, overrides

    args = Namespace(clock=clock, cpu_minutes=2.5, model=None, es_set=[], grpo_set=["beta=0.1"])
    for method in ("copes", "grpo", "lora_grpo"):
        values = overrides(Run("toy", method, {}, 1, tmp_path, "c.yaml"), args)
        budget = {k: v for k, v in values.items() if k.startswith("budget.")}
        assert {k: v for k, v in budget.items() if v is not None} == {f"budget.{key}": 150.0}
        assert values["problem.threads"] == 1 and values["problem.validation_every"] == 0
    assert values["beta"] == 0.1 and values["lora.r"] == 16


def test_a_run_that_stopped_before_its_budget_is_flagged(tmp_path) -> None:
    from benchmarks.rl_report import report

    result = made_up_result(tmp_path)
    result["finals"][2].results["stop_reason"] = "epochs"
    args = Namespace(samples=1, tuning=3, seeds=1, validation=5, heldout=4, cpu_minutes=1.0)
    text, _ = report(result, ["copes", "grpo"], args)
    assert "Not at equal CPU time**: stopped before the budget: grpo seed 1 (epochs)" in text
    assert "Not a result**: fewer than 3 tuning runs a method or 2 seeds" in text


def test_the_protocol_runs_end_to_end_on_a_tiny_model(tmp_path, capsys) -> None:
    pytest.importorskip("trl")
    from benchmarks import rl

    out = tmp_path / "out"
    argv = [
        "--quick",
        "--methods",
        "copes,grpo",
        "--tuning",
        "2",
        "--seeds",
        "1",
        "--jobs",
        "2",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "raw.json"),
    ]
    assert rl.main(argv) == 0
    text = capsys.readouterr().out
    assert "### arithmetic: held-out test at 0.05 CPU-minutes a run" in text
    raw = json.loads((tmp_path / "raw.json").read_text())["arithmetic"]
    assert len(raw["base"]["greedy"]) == 4  # questions 4-7, after the 4 validation ones
    finals = [r for r in raw["runs"] if "test" in r]
    assert sorted(r["method"] for r in finals) == ["copes", "grpo"]
    assert all(r["seed"] == 1 and r["stop_reason"] == "max_cpu_seconds" for r in finals)
    assert all(r["cpu_seconds"] >= 3.0 for r in finals)  # equal CPU budgets, reached
    tuned = [r for r in raw["runs"] if "test" not in r]
    assert len(tuned) == 4 and all("validation_accuracy" in r for r in tuned)
    for method in ("copes", "grpo"):
        runs = [r for r in tuned if r["method"] == method]
        best = max(runs, key=lambda r: r["validation_accuracy"])  # the first on a tie
        assert next(r for r in finals if r["method"] == method)["setting"] == best["setting"]
        assert not any((out / "rl" / "arithmetic" / f"tune-{method}-{i}" / "model").exists()
                       for i in range(2))  # fmt: skip
    assert (out / "rl.png").is_file() and (out / "rl_arithmetic.csv").is_file()
    assert "Not a result" in text  # 2 tuning runs and 1 seed


def test_one_setting_a_method_trains_no_tuning_run(tmp_path, monkeypatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks import rl

    trained, scored = [], []

    def train(run, args):
        trained.append(run.directory.name)
        run.results = {"steps": 1}
        return run

    def score(run_dir, args, start, stop, samples, base=False):
        scored.append((run_dir.name, start, stop, base))
        return {"greedy": [0, 1], "figures": {}}

    monkeypatch.setattr(rl, "train", train)
    monkeypatch.setattr(rl, "score", score)
    args = rl.parser().parse_args(["--tuning", "1", "--seeds", "2", "--validation", "3",
                                   "--heldout", "2", "--out", str(tmp_path)])  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        result = rl.run_task("arithmetic", ["copes", "grpo"], args, pool)
    assert result["tuning"] == []
    assert sorted(trained) == ["copes-seed1", "copes-seed2", "grpo-seed1", "grpo-seed2"]
    assert all((start, stop) == (3, 5) for _, start, stop, _ in scored)  # held-out only
    assert result["chosen"]["grpo"].setting == {"grpo.learning_rate": rl.GRPO_LEARNING_RATE}
