"""The built wheel maps the repo folders into the ``esbox`` namespace and ships its data files."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
    )
    (built,) = out.glob("esbox-*.whl")
    return built


def test_wheel_holds_the_namespaced_packages_and_no_top_level_strays(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for module in (
        "esbox/strategies/copes.py",
        "esbox/adapters/functions/catalog.py",
        "esbox/cli/main.py",
        "esbox/py.typed",
    ):
        assert module in names
    for init in (ROOT / "adapters").rglob("__init__.py"):  # every room is listed in pyproject
        assert f"esbox/adapters/{init.relative_to(ROOT / 'adapters').as_posix()}" in names
    top = {n.split("/")[0] for n in names}
    assert not top & {"strategies", "adapters", "cli", "tests"}, top


def test_installed_wheel_imports_from_outside_the_repo(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
    )
    code = (
        "import esbox, esbox.strategies.copes, esbox.adapters.functions, esbox.cli.main;"
        "print(esbox.__file__); print(*sorted(esbox.available_strategies()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site)},
    )
    first, strategies = result.stdout.splitlines()
    assert first.startswith(str(site)), first
    assert {"copes", "esopt", "openai_es"} <= set(strategies.split())
