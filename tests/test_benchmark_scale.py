"""The scale suite's ``--quick`` path on the cheap function: one process against 2 Ray workers
(with and without the driver's replica), a table with its columns, the CSV files, and a pooled
run (with a worker killed) that ends bit-identical to the one-process run."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("driver_replica", [True, False], ids=["driver-replica", "workers-only"])
def test_quick_scale_on_the_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver_replica: bool
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # benchmarks is not installed: it imports from there
    from benchmarks.scale import HEADERS, PROFILE_HEADERS

    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "scale", "--quick", "--tasks", "rastrigin",
         "--out", str(out), *([] if driver_replica else ["--no-driver-replica"])],
        capture_output=True, text=True, cwd=tmp_path, timeout=180, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert f"The driver keeps a replica: {'yes' if driver_replica else 'no'}." in lines
    header = "| " + " | ".join(HEADERS) + " |"
    assert header in lines, proc.stdout
    cells = [c.strip() for c in lines[lines.index(header) + 2].strip("|").split("|")]
    row = dict(zip(HEADERS, cells, strict=True))
    assert row["task"] == "rastrigin" and row["workers"] == "2"
    assert 0 < float(row["per-core efficiency"]) < 2
    assert row["bit-identical"] == "yes"  # despite the worker killed in the last step
    assert float(row["replacing a killed worker s"]) > 0
    assert "its replacement caught up by replay of 21 update(s)" in proc.stdout
    for name, headers in (("scale", HEADERS), ("scale_profile", PROFILE_HEADERS)):
        with (out / f"{name}.csv").open(newline="") as handle:
            table = list(csv.reader(handle))
        assert table[0] == headers and len(table) > 1
