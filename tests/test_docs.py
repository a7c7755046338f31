"""Every example in README.md and docs/*.md runs, and every printed result is checked or dated.

Code: a file's ```python blocks run in order in one namespace (a later block may use an
earlier one's names), in a throw-away working directory. A block fenced as ```python no-run is
shown but not run: use it only for code that needs a GPU, the network or a large model.
Strategies a doc registers are removed from the registry afterwards.

Printed results, one of three forms:

* ``print(...)  # -> TEXT`` in a python block: what that print wrote must match TEXT.
* a ```console check block: each ``$ `` line is run in a fresh directory (holding a link to
  ``examples/``) and what it prints must match the lines under it. ``$ esbox ...`` runs
  in-process (``*`` arguments expanded like a shell's), anything else in bash.
* "Example output of commit `SHA`" in the paragraph just above a block or table whose run is
  too heavy for CI (LLM training, benchmarks): the commit must be in this repository's history.
  A fenced block that shows a command's output (a ``$ `` line followed by other lines) must be
  checked or dated this way.

Matching: the text must be equal, except that ``...`` stands for any text (a line of just
``...`` for any lines) and durations (``1.3 s``, a table column headed ``... s``) and run
directory time stamps (``20250101-120000``) are not compared. Numbers are compared as printed,
so a result that drifts fails here; the failure shows what the command prints now. After an
intended change, ``ESBOX_UPDATE_DOCS=1 pytest tests/test_docs.py -k console`` rewrites the
outputs of console checks that no longer match (review the diff; ``# ->`` comments are edited
by hand).
"""

from __future__ import annotations

import ast
import builtins
import glob
import io
import itertools
import os
import re
import shlex
import subprocess
import sys
import tokenize
import traceback
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from esbox import registry
from esbox.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if p.is_file())
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SKIP_MARKERS = {"no-run", "norun", "skip"}
EXPECT = re.compile(r"#\s*->\s?(?P<text>.*)$")
DATED = re.compile(r"[Ee]xample\s+output\s+of\s+commit\s+`(?P<sha>[0-9a-f]{7,40})`")
VOLATILE = re.compile(r"\b\d{8}-\d{6}\b|\b\d+(?:\.\d+)? s\b")  # time stamps, durations
SHELL = re.compile(r"[|&;<>()$`]")  # a command line that needs a shell
UPDATE = os.environ.get("ESBOX_UPDATE_DOCS") == "1"


def fenced_blocks(path: Path) -> list[tuple[int, list[str], str]]:
    """``(first body line, info words, body)`` of every fenced block of a markdown file."""
    text = path.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start("body")) + 1, m["info"].strip().lower().split(), m["body"])
        for m in FENCE.finditer(text)
    ]


def python_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """``(first line number, code, runnable)`` for every python block of a markdown file."""
    return [
        (line, body, not SKIP_MARKERS & set(words[1:]))
        for line, words, body in fenced_blocks(path)
        if words and words[0] in ("python", "py")
    ]


def console_checks(path: Path) -> list[tuple[int, str]]:
    """``(first line, body)`` of every ```console check block."""
    return [
        (line, body)
        for line, words, body in fenced_blocks(path)
        if words[:1] == ["console"] and "check" in words[1:]
    ]


RUNNABLE_DOCS = [p for p in DOC_FILES if any(run for _, _, run in python_blocks(p))]
CHECKED_DOCS = [p for p in DOC_FILES if console_checks(p)]


# -- matching ---------------------------------------------------------------------------------
def _text_pattern(text: str) -> str:
    """A regex for one expected line: ``...`` is any text, volatile values any such value."""
    pieces = []
    for chunk in text.split("..."):
        out, last = [], 0
        for match in VOLATILE.finditer(chunk):
            out.append(re.escape(chunk[last : match.start()]))
            out.append(r"\d{8}-\d{6}" if "-" in match.group() else r"\d+(?:\.\d+)? s")
            last = match.end()
        pieces.append("".join([*out, re.escape(chunk[last:])]))
    return "[^\n]*".join(pieces)


def _line_patterns(expected: list[str]) -> list[str | None]:
    """One regex per expected line, ``None`` for a line of ``...``; in a markdown table the
    cells of a column whose header ends in `` s`` (a duration) match anything."""
    patterns: list[str | None] = []
    volatile: set[int] = set()
    for index, line in enumerate(expected):
        if line.strip() == "...":
            patterns.append(None)
            continue
        if line.startswith("|"):
            cells = line.split("|")
            if index == 0 or not expected[index - 1].startswith("|"):  # the table's header
                volatile = {i for i, cell in enumerate(cells) if cell.strip().endswith(" s")}
            parts = ["[^|]*" if i in volatile else _text_pattern(c) for i, c in enumerate(cells)]
            patterns.append(r"\|".join(parts))
        else:
            patterns.append(_text_pattern(line))
    return patterns


def output_matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` output matches the ``expected`` text shown in a doc."""

    def match(patterns: list[str | None], lines: list[str]) -> bool:
        if not patterns:
            return not lines
        head, rest = patterns[0], patterns[1:]
        if head is None:
            return any(match(rest, lines[k:]) for k in range(len(lines) + 1))
        return bool(lines) and re.fullmatch(head, lines[0]) is not None and match(rest, lines[1:])

    def lines_of(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip("\n").split("\n")] if text.strip() else []

    return match(_line_patterns(lines_of(expected)), lines_of(actual))


# -- python blocks: print(...)  # -> TEXT --------------------------------------------------------
def expected_prints(source: str) -> dict[tuple[int, int], str]:
    """``{(first line, last line) of a print call: expected text}`` from ``# -> TEXT`` comments."""
    calls = [
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
    ]
    expected = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        match = EXPECT.match(token.string) if token.type == tokenize.COMMENT else None
        if match is None:
            continue
        line = token.start[0]
        spans = [span for span in calls if span[0] <= line <= span[1]]
        assert spans, f"line {line}: a '# ->' comment must be on a print(...) call"
        expected[min(spans, key=lambda s: s[1] - s[0])] = match["text"].rstrip()
    return expected


class RecordingPrint:
    """The docs' ``print``: prints as usual and keeps what each line of the doc printed."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.printed: dict[int, list[str]] = defaultdict(list)

    def __call__(self, *args, sep=" ", end="\n", file=None, flush=False) -> None:
        builtins.print(*args, sep=sep, end=end, file=file, flush=flush)
        if file not in (None, sys.stdout):
            return
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != self.filename:
            frame = frame.f_back
        if frame is not None:
            text = io.StringIO()
            builtins.print(*args, sep=sep, end=end, file=text)
            self.printed[frame.f_lineno].append(text.getvalue())

    def between(self, first: int, last: int) -> str:
        return "".join(text for n in range(first, last + 1) for text in self.printed.get(n, []))


def check_prints(path: Path, namespace: dict, code: str, line: int) -> None:
    """Run one python block of ``path`` in ``namespace`` and compare its ``# ->`` outputs."""
    source = "\n" * (line - 1) + code  # pad so line numbers are the markdown file's
    recorder = RecordingPrint(str(path))
    namespace["print"] = recorder
    exec(compile(source, str(path), "exec"), namespace)
    for (first, last), expected in sorted(expected_prints(source).items()):
        actual = recorder.between(first, last)
        assert output_matches(expected, actual), (
            f"{path.name}:{first}: the doc shows `# -> {expected}` but it printed:\n{actual}"
        )


# -- console check blocks -------------------------------------------------------------------------
def console_steps(body: str) -> list[tuple[str, str]]:
    """``(command, expected output)`` pairs of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"console block: output before the first '$ ' line: {line!r}")
    return [(command, "\n".join(lines)) for command, lines in steps]


def run_command(command: str, cwd: Path) -> str:
    """What ``command`` prints (stdout and stderr) when run in ``cwd``."""
    words = shlex.split(command, comments=True)
    if words[:1] == ["esbox"] and not SHELL.search(command.split("#")[0]):
        args = [
            match
            for word in words[1:]
            for match in (sorted(glob.glob(word, root_dir=cwd)) if "*" in word else []) or [word]
        ]
        result = CliRunner().invoke(cli, args, catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            return result.output + "".join(traceback.format_exception(*result.exc_info))
        return result.output
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    return done.stdout + done.stderr


def run_console(body: str, cwd: Path, monkeypatch) -> list[tuple[str, str, str]]:
    """``(command, expected, actual output)`` of each step of a console block run in ``cwd``."""
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(cwd)
    return [(c, expected, run_command(c, cwd)) for c, expected in console_steps(body)]


def check_console(path: Path, line: int, body: str, cwd: Path, monkeypatch) -> None:
    """Run a console check block in ``cwd``; AssertionError at the first output that differs."""
    for command, expected, actual in run_console(body, cwd, monkeypatch):
        assert output_matches(expected, actual), (
            f"{path.name}:{line}: `$ {command}` prints:\n{actual}\nbut the doc shows:\n{expected}"
        )


def updated_console(body: str, cwd: Path, monkeypatch) -> str:
    """``body`` with the output of each step that no longer matches replaced by what it prints."""
    lines = []
    for command, expected, actual in run_console(body, cwd, monkeypatch):
        shown = expected if output_matches(expected, actual) else actual.strip("\n")
        lines += [f"$ {command}", *([shown] if shown.strip() else [])]
    return "\n".join(lines) + "\n"


# -- fixtures ---------------------------------------------------------------------------------
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


# -- the docs -----------------------------------------------------------------------------------
def test_doc_files_are_found() -> None:
    names = {p.name for p in RUNNABLE_DOCS}
    assert {"quickstart.md", "strategies.md", "writing-a-strategy.md"} <= names
    assert {"cli.md"} <= {p.name for p in CHECKED_DOCS}


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
    monkeypatch.chdir(tmp_path)
    # a real module, so dataclasses and typing.get_type_hints resolve the doc's names
    module = types.ModuleType(f"esbox_doc_{path.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for line, code, runnable in python_blocks(path):
        if runnable:
            check_prints(path, module.__dict__, code, line)


@pytest.mark.parametrize("path", CHECKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_console_outputs_match(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread
) -> None:
    for line, body in console_checks(path):
        cwd = tmp_path / f"block-{line}"
        if UPDATE:
            text = path.read_text(encoding="utf-8")
            path.write_text(text.replace(body, updated_console(body, cwd, monkeypatch), 1))
        else:
            check_console(path, line, body, cwd, monkeypatch)


def _paragraph_above(text: str, offset: int) -> str:
    """The last paragraph of ``text`` before ``offset`` (blank lines end a paragraph)."""
    return re.split(r"\n[ \t]*\n", text[:offset].rstrip())[-1]


def unchecked_outputs(path: Path) -> list[int]:
    """Lines of the fenced blocks of ``path`` that show a command's output (a ``$ `` line
    followed by another line) yet are neither a console check nor dated."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        words = match["info"].strip().lower().split()
        lines = [line for line in match["body"].splitlines() if line.strip()]
        shows_output = any(
            a.startswith("$ ") and not b.startswith("$ ") for a, b in itertools.pairwise(lines)
        )
        checked = words[:1] == ["console"] and "check" in words
        if shows_output and not checked and not DATED.search(_paragraph_above(text, match.start())):
            found.append(text.count("\n", 0, match.start()) + 1)
    return found


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shown_outputs_are_checked_or_dated(path: Path) -> None:
    """A block that shows what a command printed is a console check or an example output of a
    named commit."""
    assert unchecked_outputs(path) == [], (
        f"{path.name}: a block showing output must be ```console check, or follow a paragraph "
        f"saying 'Example output of commit `SHA`'"
    )


def test_an_undated_output_block_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    shown = "```console\n$ esbox optimize\ncopes on rastrigin(d=100): best 1.0\n```\n"
    doc.write_text(f"Text.\n\n{shown}\nExample output of commit `3042290`:\n\n{shown}")
    assert unchecked_outputs(doc) == [3]
    doc.write_text(shown.replace("console", "console check") + "```bash\n$ ls\n$ pwd\n```\n")
    assert unchecked_outputs(doc) == []


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_example_outputs_name_commits_of_this_history() -> None:
    """Each "Example output of commit `SHA`" names a commit that HEAD descends from."""
    dated = [
        (path.name, match["sha"])
        for path in DOC_FILES
        for match in DATED.finditer(path.read_text(encoding="utf-8"))
    ]
    assert dated, "no dated example outputs found: is the marker still spelled the same?"
    assert _git("rev-parse", "--git-dir").returncode == 0, f"{ROOT} is not a git checkout"
    for name, sha in dated:
        found = _git("merge-base", "--is-ancestor", sha, "HEAD")
        assert found.returncode == 0, f"{name}: commit {sha} is not in the history of HEAD"


# -- the checks can fail --------------------------------------------------------------------------
def test_output_matching_ignores_only_durations_stamps_and_ellipses() -> None:
    shown = "copes: best 1066.16 after 1250 steps in 3.0 s -> runs/copes-20250101-120000"
    now = "copes: best 1066.16 after 1250 steps in 1.3 s -> runs/copes-20261206-073310"
    assert output_matches(shown, now)
    assert not output_matches(shown.replace("1066.16", "1246.05"), now)
    assert not output_matches(shown.replace("1250", "1251"), now)
    assert output_matches("best ... after 1250 steps...", now.split(": ")[1])
    table = "| run | best | wall s |\n|---|---|---|\n| a | 818.401 | 2.4 |"
    assert output_matches(table, table.replace("2.4", "0.927"))
    assert not output_matches(table, table.replace("818.401", "720.755"))
    assert output_matches("first\n...\nlast", "first\nmiddle\nmore\nlast")
    assert not output_matches("first\nlast", "first\nmiddle\nlast")


def test_a_drifted_console_output_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md's default run as it read before 2a9d589 (best 1246.05): the check fails."""
    cli_md = ROOT / "docs" / "cli.md"
    line, body = next(b for b in console_checks(cli_md) if "optimize --strategy copes\n" in b[1])
    drifted = re.sub(r"best [0-9.]+ after", "best 1246.05 after", body)
    assert drifted != body
    with pytest.raises(AssertionError, match=r"but the doc shows:\n.*best 1246\.05"):
        check_console(cli_md, line, drifted, tmp_path / "drifted", monkeypatch)
    check_console(cli_md, line, body, tmp_path / "as-shown", monkeypatch)


def test_a_drifted_print_comment_fails(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    code = "total = sum(range(5))\nprint(total)  # -> 10\nprint(\n    total + 1,\n)  # -> 12\n"
    with pytest.raises(AssertionError, match=r"doc.md:3: the doc shows `# -> 12` but it printed:"):
        check_prints(doc, {}, code, 1)
    with pytest.raises(AssertionError, match="must be on a print"):
        check_prints(doc, {}, "x = 1  # -> 1\n", 1)
    check_prints(doc, {}, code.replace("-> 12", "-> 11"), 1)


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
