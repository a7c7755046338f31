"""A third-party strategy as a real package: examples/plugin is built into a wheel (no network)
and pip-installed into a fresh virtual environment, where esbox finds it through the
``esbox.strategies`` entry point.

The venv sees this environment's packages (esbox, its dependencies, pytest) through a ``.pth``
file, as ``--system-site-packages`` would, so nothing is downloaded; the plugin itself lands in
the venv. Everything that needs the plugin runs with the venv's python, so this test
environment (and its registry) is never changed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "plugin"
NAME = "ars"


def pip(python: str | Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", *args, "--quiet"], check=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The plugin's wheel, built from a copy (an in-tree build would litter examples/)."""
    source = tmp_path_factory.mktemp("src") / "plugin"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    dist = tmp_path_factory.mktemp("dist")
    pip(
        sys.executable,
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        str(dist),
        str(source),
    )
    (built,) = dist.glob("esbox_ars-*.whl")
    return built


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory) -> Path:
    """The interpreter of a fresh venv into which pip installed the wheel (with no index: the
    plugin's dependency on esbox is met by this environment's esbox)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run([python, "-c", where], capture_output=True, text=True, check=True)
    ours = dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]])
    lines = [f"import site; site.addsitedir({path!r})\n" for path in ours]
    (Path(purelib.stdout.strip()) / "_outer_site.pth").write_text("".join(lines))
    pip(python, "install", "--no-index", "--no-build-isolation", str(wheel))
    return python


def run(python: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def esbox(python: Path, *args: str, cwd: Path = ROOT) -> str:
    result = run(python, "-m", "esbox.cli.main", *args, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_wheel_holds_the_module_and_the_entry_point(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    assert "esbox_ars.py" in archive.namelist()
    (entry_points,) = [n for n in archive.namelist() if n.endswith("entry_points.txt")]
    text = archive.read(entry_points).decode()
    assert "[esbox.strategies]" in text and "ars = esbox_ars:ARS" in text


def test_pip_installed_it_into_the_venv_only(python: Path) -> None:
    import esbox

    assert NAME not in esbox.available_strategies()  # this process's registry is untouched
    where = "import esbox_ars, sys; print(sys.prefix); print(esbox_ars.__file__)"
    prefix, module = run(python, "-c", where).stdout.split()
    assert Path(prefix) == python.parents[1] and Path(module).is_relative_to(prefix)


def test_esbox_strategies_lists_and_shows_it(python) -> None:
    listing = esbox(python, "strategies")
    assert re.search(rf"^{NAME}\s+ARS \(V1-t\)", listing, re.MULTILINE), listing
    assert "top_directions=0" in listing
    shown = esbox(python, "strategies", NAME)
    assert "Mania, Guy & Recht 2018" in shown  # the module docstring names the paper
    assert "top_directions" in shown and "directions b kept per step" in shown


def test_optimize_runs_it_and_resume_is_bit_identical(python, tmp_path: Path) -> None:
    common = ["optimize", "-q", "--strategy", NAME, "--set", "problem.dimension=20"]
    common += ["--set", "options.top_directions=4", "--set", "checkpoint.every=3"]
    esbox(python, *common, "--set", "budget.max_steps=12", "--out", str(tmp_path / "straight"))
    esbox(python, *common, "--set", "budget.max_steps=6", "--out", str(tmp_path / "split"))
    resumed = esbox(python, "resume", "-q", str(tmp_path / "split"), "--set", "budget.max_steps=12")
    assert f"{NAME} on rastrigin(d=20)" in resumed
    straight, split = tmp_path / "straight", tmp_path / "split"
    for name in ("final.npy", "best.npy"):
        assert np.array_equal(np.load(straight / name), np.load(split / name))

    def rows(run: Path) -> list[dict]:
        records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in records]

    assert len(rows(straight)) == 12 and rows(straight) == rows(split)
    summary, reference = (json.loads((r / "summary.json").read_text()) for r in (split, straight))
    assert summary["resumed"] is True and summary["strategy"] == NAME
    assert summary["best_value"] == reference["best_value"]


def test_the_registry_wide_contract_runs_on_it_unchanged(python) -> None:
    """esbox's own contract modules, run as they are with the plugin installed: every test
    parametrized over the registry has an ``ars`` case, and every case passes."""
    modules = ["tests/test_strategies.py", "tests/test_loop.py"]
    result = run(python, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *modules)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    passed = set(re.findall(r"^PASSED (\S+)", result.stdout, re.MULTILINE))
    builtin = {test for test in passed if re.search(r"[\[-]openai_es[\]-]", test)}
    assert builtin, result.stdout[-2000:]
    for test in builtin:  # the same test, with the plugin in place of openai_es
        twin = re.sub(r"([\[-])openai_es([\]-])", rf"\g<1>{NAME}\g<2>", test)
        assert twin in passed, f"{twin} did not run or did not pass"


def test_the_plugin_passes_its_own_tests(python, tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    shutil.copytree(PLUGIN / "tests", tests)
    result = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"\b5 passed\b", result.stdout), result.stdout
