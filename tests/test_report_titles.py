"""Every figure of ``esbox report`` is titled with the problem, the strategies and the runs
(issue 19): a PNG read out of context still says what it shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

from esbox.cli.main import cli
from esbox.cli.report import load_run, plot_title

QUICK = ["--set", "budget.max_steps=4", "--set", "options.population=8"]


def optimize(out: Path, strategy: str, problem: str = "rastrigin", *extra: str) -> Path:
    args = ["optimize", "-q", "--strategy", strategy, "--out", str(out), *QUICK, *extra]
    result = CliRunner().invoke(cli, [*args, "--set", f"problem={{name: {problem}, dimension: 6}}"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def titles(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The title of every figure the report saves, by file name, read off the figure itself
    (line breaks of a wrapped title as spaces; the raw title under ``raw:NAME``)."""
    saved: dict[str, str] = {}
    savefig = Figure.savefig

    def record(fig: Figure, path, *args, **kwargs):
        saved[Path(path).name] = fig.get_suptitle().replace("\n", " ")
        saved[f"raw:{Path(path).name}"] = fig.get_suptitle()
        return savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return saved


def report(*runs: Path, out: Path) -> None:
    result = CliRunner().invoke(cli, ["report", *map(str, runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "reward.png").is_file() and (out / "best.png").is_file()


def test_one_run_names_its_problem_strategy_and_run(tmp_path, titles) -> None:
    run = optimize(tmp_path / "sphere-copes-1", "copes", "sphere")
    report(run, out=tmp_path / "report")
    assert titles["reward.png"] == titles["best.png"] == "sphere(d=6): copes (sphere-copes-1)"


def test_compared_runs_each_name_their_strategy_and_run(tmp_path, titles) -> None:
    copes = optimize(tmp_path / "a", "copes")
    openai = optimize(tmp_path / "b", "openai_es")
    report(copes, openai, out=tmp_path / "report")
    assert titles["reward.png"] == titles["best.png"] == "rastrigin(d=6): copes (a), openai_es (b)"


def test_runs_on_different_problems_name_each_problem(tmp_path, titles) -> None:
    sphere = optimize(tmp_path / "s", "copes", "sphere")
    rastrigin = optimize(tmp_path / "r", "openai_es")
    report(sphere, rastrigin, out=tmp_path / "report")
    expected = "copes on sphere(d=6) (s); openai_es on rastrigin(d=6) (r)"
    assert titles["best.png"] == expected


def test_a_run_without_summary_is_named_from_its_config(tmp_path) -> None:
    """A killed run has no summary.json: the config's strategy and problem name stand in."""
    run = optimize(tmp_path / "killed", "copes")
    (run / "summary.json").unlink()
    assert plot_title([load_run(run)]) == "rastrigin: copes (killed)"


def test_a_long_title_wraps_at_spaces_only(tmp_path, titles) -> None:
    names = [f"a-long-run-directory-name-{i}" for i in range(5)]
    runs = [optimize(tmp_path / name, "copes") for name in names]
    report(*runs, out=tmp_path / "report")
    assert "\n" in titles["raw:reward.png"]
    assert all(name in titles["raw:reward.png"] for name in names)  # never cut inside a name
    assert titles["reward.png"] == plot_title([load_run(run) for run in runs])
