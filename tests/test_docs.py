"""Every ```python block in README.md and docs/*.md runs, so the docs cannot drift from the code.

A file's blocks run in order in one namespace (a later block may use an earlier one's names),
in a throw-away working directory. A block fenced as ```python no-run is shown but not run:
use it only for code that needs a GPU, the network or a large model. Strategies a doc
registers are removed from the registry afterwards, so they never leak into other tests.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch

from esbox import registry

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if p.is_file())
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SKIP_MARKERS = {"no-run", "norun", "skip"}


def python_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """``(first line number, code, runnable)`` for every python block of a markdown file."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        words = match["info"].strip().lower().split()
        if not words or words[0] not in ("python", "py"):
            continue
        line = text.count("\n", 0, match.start("body")) + 1
        blocks.append((line, match["body"], not SKIP_MARKERS & set(words[1:])))
    return blocks


RUNNABLE_DOCS = [p for p in DOC_FILES if any(run for _, _, run in python_blocks(p))]


@pytest.fixture
def one_thread():
    """Small tensors: one intra-op thread is fastest, and immune to a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def clean_registry():
    """Restore the strategy registry to what it was before the doc ran."""
    registry.available_strategies()  # discover built-ins and plugins first
    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def test_doc_files_are_found() -> None:
    names = {p.name for p in RUNNABLE_DOCS}
    assert {"quickstart.md", "strategies.md", "writing-a-strategy.md"} <= names


def test_block_parser_honours_the_no_run_marker(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n```python\nx = 1\n```\n```python no-run\nimport vllm\n```\n"
        "```bash\nls\n```\n```py\ny = x + 1\n```\n"
    )
    assert python_blocks(doc) == [
        (3, "x = 1\n", True),
        (6, "import vllm\n", False),
        (12, "y = x + 1\n", True),
    ]


@pytest.mark.parametrize("path", RUNNABLE_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_examples_run(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registry, one_thread
) -> None:
    blocks = python_blocks(path)
    monkeypatch.chdir(tmp_path)
    # a real module, so dataclasses and typing.get_type_hints resolve the doc's names
    module = types.ModuleType(f"esbox_doc_{path.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for line, code, runnable in blocks:
        if not runnable:
            continue
        # pad so tracebacks point at the line in the markdown file
        source = "\n" * (line - 1) + code
        exec(compile(source, str(path), "exec"), module.__dict__)


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run installs and tests with exactly the README's test command, piece by piece."""
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"Run the tests.*?```bash\n(.+?)\n```", readme, re.S).group(1)
    ci_lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    pieces = [piece.strip() for piece in command.split("&&")]
    install, test = " && ".join(pieces[:-1]), pieces[-1]
    assert install in ci_lines
    assert test in ci_lines
    assert ci_lines.index(install) < ci_lines.index(test)
