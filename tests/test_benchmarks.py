"""The benchmarks package: the suite registry and ``--help``, the child protocol of
``benchmarks.measure`` and its table and CSV helpers (the suites themselves are not run)."""

from __future__ import annotations

import csv
import importlib
import os
import subprocess
import sys
from pathlib import Path

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
