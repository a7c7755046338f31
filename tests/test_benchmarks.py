"""The benchmarks package: the suite registry and ``--help``, the child protocol of
``benchmarks.measure``, its table and CSV helpers, the scoring of the comparison suites, the
peer interface and its skip path, and ``--quick`` smoke runs of overhead, quality and copes."""

from __future__ import annotations

import csv
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks`` is not installed: it imports from the repository root."""
    monkeypatch.syspath_prepend(str(ROOT))


def run_main(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )


def test_help_lists_every_suite_from_any_directory(tmp_path: Path) -> None:
    from benchmarks.__main__ import SUITES

    assert {"core", "llm"} <= set(SUITES)
    proc = run_main("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    suites = proc.stdout.split("suites:\n", 1)[1].splitlines()
    listed = {line.split()[0] for line in suites if line.strip()}
    assert listed == {*SUITES, "all"}
    for name, module in SUITES.items():
        suite = importlib.import_module(module)
        assert callable(suite.main), name
        assert suite.parser().parse_args(["--quick", "--csv", "out"]).csv == "out"


def test_unknown_suite_is_an_error(tmp_path: Path) -> None:
    proc = run_main("nope", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unknown suite 'nope'" in proc.stderr


def test_run_child_round_trips_a_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import measure

    monkeypatch.chdir(tmp_path)  # the child still finds the package, and runs in the root
    spec = {"kind": "echo", "env_var": "ESBOX_BENCH_PROBE", "sizes": [1, 2.5], "name": "x y"}
    result = measure.run_child(
        "benchmarks.measure", spec, env={"ESBOX_BENCH_PROBE": "42"}, timeout=60
    )
    assert result["spec"] == spec
    assert result["env"] == "42"
    assert Path(result["cwd"]) == ROOT
    assert result["rss_mib"] > 0


def test_run_child_failure_carries_the_stderr_tail() -> None:
    from benchmarks import measure

    with pytest.raises(RuntimeError, match="No module named"):
        measure.run_child("benchmarks.no_such_suite", {"kind": "echo"}, timeout=60)


def test_table_and_csv(tmp_path: Path) -> None:
    from benchmarks import measure

    headers, rows = ["N", "peak (MiB)", "note"], [[16, "1,234", "a, b"], [256, "1,240", ""]]
    assert measure.table(headers, rows) == "\n".join(
        [
            "| N | peak (MiB) | note |",
            "|---|---|---|",
            "| 16 | 1,234 | a, b |",
            "| 256 | 1,240 |  |",
        ]
    )
    assert measure.table(headers, rows, align="lrl").splitlines()[1] == "|---|---:|---|"
    with pytest.raises(ValueError, match="align"):
        measure.table(headers, rows, align="lr")
    path = measure.write_csv(tmp_path / "new" / "t.csv", headers, rows)
    with path.open(newline="") as handle:
        assert list(csv.reader(handle)) == [headers, ["16", "1,234", "a, b"], ["256", "1,240", ""]]
    written = measure.write_tables(tmp_path / "d", {"a": (headers, rows), "b": (["x"], [[1]])})
    assert [p.name for p in written] == ["a.csv", "b.csv"]
    assert measure.write_tables(None, {"a": (headers, rows)}) == []


def test_memory_probes() -> None:
    from benchmarks import measure

    assert measure.settle() > 0
    assert measure.peak_mib() >= measure.rss_mib() * 0.5
    assert isinstance(measure.reset_peak(), bool)
    elapsed = measure.stopwatch()
    assert 0 <= elapsed() < 60


# -- the comparison suites: scoring, the peer interface, and --quick smoke runs ------------------
PEER_LIBRARIES = ("nevergrad", "cma", "evosax", "evotorch")


@pytest.fixture
def no_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mask every peer library, as on a machine without benchmarks/requirements.txt."""
    for name in PEER_LIBRARIES:
        monkeypatch.setitem(sys.modules, name, None)  # import then raises ImportError


def tables_in(text: str) -> list[list[str]]:
    """The markdown tables of a report, each as its lines."""
    found, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return found


def assert_well_formed(text: str, count: int) -> None:
    tables = tables_in(text)
    assert len(tables) >= count, text
    for lines in tables:
        assert len(lines) >= 3, lines  # header, rule, at least one row
        assert set(lines[1]) <= set("|-:"), lines[1]
        assert len({line.count("|") for line in lines}) == 1, lines


def read_csv(path: Path) -> list[list[str]]:
    with path.open(newline="") as handle:
        return list(csv.reader(handle))


def test_tracker_counts_to_the_budget_and_records_first_hits() -> None:
    from benchmarks import functions

    sphere = functions.problem("sphere")
    tracker = functions.Tracker(sphere, budget=5, targets=[10.0, 1.0])
    assert tracker(np.full(4, 3.0)) == 36.0
    values = tracker(np.array([[1.0, 1, 1, 1], [0.5, 0, 0, 0], [0, 0, 0, 0], [9, 9, 9, 9]]))
    assert list(values) == [4.0, 0.25, 0.0, 324.0]
    assert tracker.evaluations == 5 and tracker.spent
    assert tracker.hits == [2, 3] and tracker.best == 0.0
    with pytest.raises(functions.BudgetSpent):
        tracker(np.zeros(4))
    bent = functions.problem("bent_cigar")
    assert bent(np.array([2.0, 1e-3])) == pytest.approx(4.0 + 1e6 * 1e-6)
    assert bent.optimum_value(10) == 0.0


def test_ert_is_cocos_expected_running_time() -> None:
    from benchmarks import functions

    # two successes at 100 and 300 evaluations, one failure after 1,000: (100 + 300 + 1000) / 2
    assert functions.ert([100, 300, None], [500, 500, 1000]) == (700.0, pytest.approx(2 / 3))
    assert functions.ert([None, None], [10, 10]) == (np.inf, 0.0)
    assert functions.quartiles([1, 2, 3, 4, 5]) == (3.0, 2.0, 4.0)
    assert functions.standard_error([1.0, 3.0]) == (2.0, 1.0)


def test_targets_are_fractions_of_the_gap_to_the_optimum() -> None:
    from benchmarks import functions

    x0 = functions.start_point(6, seed=1)
    assert np.all(np.abs(x0) <= 4) and np.array_equal(x0, functions.start_point(6, seed=1))
    f0, targets = functions.targets_for(functions.problem("sphere"), x0, (0.5, 0.1))
    assert targets == pytest.approx([0.5 * f0, 0.1 * f0])


@pytest.mark.parametrize("name", ["ng-DiagonalCMA", "pycma", "evosax-SNES", "evotorch-SNES"])
def test_each_peer_runs_a_budget_or_is_skipped_with_a_note(name: str) -> None:
    from benchmarks import peers, quality_runs

    ready, notes = peers.split_available([name])
    if not ready:  # the skip path: a note naming the package and how to install it
        assert notes and peers.PEERS[name].library in notes[0] and "requirements" in notes[0]
        return
    spec = {"method": name, "problem": "sphere", "d": 8, "seed": 0, "budget": 300,
            "max_seconds": 60}  # fmt: skip
    result = quality_runs.run(spec)
    assert not result["stop"].startswith("error"), result["stop"]
    assert 0 < result["evaluations"] <= 300
    assert result["best"] < result["f0"]


def test_masked_peers_are_skipped_with_a_note(no_peers: None) -> None:
    from benchmarks import peers

    ready, notes = peers.split_available(list(peers.PEERS))
    assert ready == []
    assert len(notes) == len(peers.PEERS)
    assert all("is not installed" in note for note in notes)
    with pytest.raises(ValueError, match="unknown peers"):
        peers.split_available(["nope"])


def test_quality_quick_without_peers(
    tmp_path: Path, no_peers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import quality

    assert quality.main(["--quick", "--jobs", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ng-NGOpt: skipped, `nevergrad` is not installed" in out
    assert_well_formed(out, count=3)  # d = 20, d = 200, summary
    runs = read_csv(tmp_path / "quality_runs.csv")
    strategies = set(esbox_names())
    assert {row[0] for row in runs[1:]} == strategies
    assert all(not row[-1].startswith("error") for row in runs[1:])
    assert len(runs) - 1 == len(strategies) * 3 * 2 * 3  # functions x dimensions x seeds
    assert (tmp_path / "quality_summary.csv").exists()
    assert (tmp_path / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_overhead_quick_without_peers(
    tmp_path: Path, no_peers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import overhead

    argv = ["--quick", "--strategies", "openai_es,copes", "--out", str(tmp_path)]
    assert overhead.main(argv) == 0
    out = capsys.readouterr().out
    assert "evosax-Open_ES: skipped" in out
    assert_well_formed(out, count=2)
    rows = read_csv(tmp_path / "overhead_runs.csv")
    assert len(rows) - 1 == 2 * 2 * 2  # strategies x (d, N) cells
    assert all(float(row[3]) > 0 and float(row[4]) >= 0 for row in rows[1:])
    assert (tmp_path / "overhead.png").read_bytes()[:4] == b"\x89PNG"


def test_overhead_skips_a_peer_whose_population_does_not_fit() -> None:
    from benchmarks import overhead

    cell = overhead.measure_peer("pycma", 10**7, 256, 60, max_gib=2.0, min_seconds=1)
    assert cell == {"skip": "skipped: N x d population 19.1 GiB"}


def test_copes_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import copes

    assert copes.main(["--quick", "--jobs", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert_well_formed(out, count=2)  # sphere, Rastrigin
    rows = read_csv(tmp_path / "copes_sphere.csv")
    assert [row[1] for row in rows[1:]] == [label for _, label, _, _ in copes.CONFIGS]
    assert [row[2] for row in rows[1:] if row[0] == "N = 40, no antithetic"] == [
        "40", "20", "10", "5"
    ]  # fmt: skip
    assert (tmp_path / "copes_k.png").read_bytes()[:4] == b"\x89PNG"


def esbox_names() -> list[str]:
    import esbox

    return list(esbox.available_strategies())


def test_generation_quick_on_a_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    pytest.importorskip("transformers")
    from benchmarks import generation
    from esbox.adapters.models.testing import save_tiny_lm

    model = save_tiny_lm(tmp_path / "tiny")
    argv = ["--quick", "--workloads", "arithmetic", "--model", str(model), "--out", str(tmp_path)]
    assert generation.main(argv) == 0
    out = capsys.readouterr().out
    assert "### arithmetic rollouts, float32, 1 thread(s)" in out
    rows = read_csv(tmp_path / "generation_arithmetic_float32_1.csv")
    assert [(row[0], row[1]) for row in rows[1:]] == [
        (batch, arm) for batch in ("1", "4") for arm in ("reused", "before", "forward")
    ]
    assert all(float(row[2]) > 0 for row in rows[1:])  # tokens/s of every cell
    assert "sys share at most" in out and "time per sequence" in out


def test_coco_quick_writes_coco_data_that_agrees_with_its_tables(tmp_path: Path) -> None:
    """``python -m benchmarks coco --quick`` (bbob f1 and f15 at d = 10, 100 d evaluations) on
    esbox's default and pycma IPOP: a COCO data folder per method whose final values match the
    suite's own record of each run (f - f_opt, so f_opt is right), and ECDF tables."""
    pytest.importorskip("cocoex")
    pytest.importorskip("cma")
    from benchmarks import coco

    argv = ["--quick", "--strategies", "", "--peers", "pycma-ipop", "--jobs", "1",
            "--no-cocopp", "--out", str(tmp_path)]  # fmt: skip
    assert coco.main(argv) == 0
    runs = read_csv(tmp_path / "coco_runs.csv")
    head, rows = runs[0], runs[1:]
    assert {(r[0], r[3]) for r in rows} == {(m, f) for m in ("esbox-default", "pycma-ipop")
                                            for f in ("1", "15")}  # fmt: skip
    for row in rows:
        record = dict(zip(head, row, strict=True))
        assert not record["error"] and int(record["evaluations"]) <= 1000 + 40
        info = tmp_path / "exdata" / f"{record['method']}-bbob-d10" / f"bbobexp_f{row[3]}.info"
        assert f"algId = '{record['method']}'" in info.read_text()
        evaluations, final = info.read_text().splitlines()[-1].split(", 1:")[1].split("|")
        assert int(evaluations) == int(record["evaluations"])
        assert float(final) == pytest.approx(float(record["best f - f_opt"]), rel=0.05)
    sphere = [dict(zip(head, r, strict=True)) for r in rows if r[3] == "1"]
    assert all(int(r["targets reached"]) >= 30 for r in sphere)  # f - f_opt < 1e-4 on f1
    table = read_csv(tmp_path / "coco_bbob_d10.csv")
    assert [r[0] for r in table[1:]] == ["esbox-default", "pycma-ipop"]
    assert all(0.0 <= float(v) <= 1.0 for r in table[1:] for v in r[1:-2])
    assert (tmp_path / "coco_ecdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
