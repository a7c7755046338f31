"""Two run directories compared file by file, as the resume tests do (tests/test_resume_files.py
for ES runs, tests/test_grpo_resume_files.py for GRPO runs).

Every file is compared, walked from the directory, so a kind of file added to the run directory
later is compared by default: bytes, or the data of a JSON, JSONL or YAML file (or of a file a
``reader`` decodes) less the dotted keys allow-listed for it. A dotted key goes into lists, so
``history.wall_seconds`` is that key of every row of ``history``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from esbox.cli.main import cli

Reader = Callable[[Path], Any]


def assert_same_files(
    a: Path,
    b: Path,
    ignored: Mapping[str, set[str]],
    readers: Mapping[str, Reader] | None = None,
) -> None:
    """Every file of ``a`` and ``b`` alike, less the ``ignored`` keys of the files whose path
    matches a glob; ``readers`` decode other files (by glob) into data compared the same way."""
    names = [{p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()} for d in (a, b)]
    assert names[0] == names[1], f"files differ: {sorted(names[0] ^ names[1])}"
    for name in sorted(names[0]):
        keys = set().union(*(k for glob, k in ignored.items() if fnmatch(name, glob)))
        reader = next((r for glob, r in (readers or {}).items() if fnmatch(name, glob)), None)
        left, right = (content(d / name, keys, reader) for d in (a, b))
        assert left == right, f"{name} differs at {differences(left, right)[:5]}"


def content(path: Path, ignored: set[str], reader: Reader | None = None) -> Any:
    """What is compared of a file: its data less the ``ignored`` keys, or its bytes."""
    if reader is not None:
        return comparable(reader(path), ignored)
    if path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        return [comparable(json.loads(line), ignored) for line in lines]
    if path.suffix == ".json":
        return comparable(json.loads(path.read_text()), ignored)
    if path.suffix == ".yaml":
        return comparable(yaml.safe_load(path.read_text()), ignored)
    return path.read_bytes()


def comparable(data: Any, ignored: set[str]) -> str:
    """``data`` without the dotted ``ignored`` keys, as canonical JSON (NaN equals NaN)."""
    for key in ignored:
        _drop(data, key.split("."))
    return json.dumps(data, sort_keys=True)


def _drop(node: Any, path: Sequence[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _drop(item, path)
    elif isinstance(node, dict):
        head, *rest = path
        if rest:
            _drop(node.get(head), rest)
        else:
            node.pop(head, None)


def differences(left: Any, right: Any) -> list[str]:
    """Where two compared contents differ: dotted paths (``[i]`` for list items), or
    ``bytes`` for raw files."""
    if isinstance(left, bytes) or isinstance(right, bytes):
        return ["bytes"] if left != right else []
    if isinstance(left, list):  # a JSONL file: one canonical JSON text a line
        if len(left) != len(right):
            return [f"{len(left)} lines against {len(right)}"]
        pairs = enumerate(zip(left, right, strict=True))
        return [f"line {i}: {where}" for i, pair in pairs for where in _paths(*pair)]
    return _paths(left, right)


def _paths(left: str, right: str) -> list[str]:
    found: list[str] = []

    def walk(x: Any, y: Any, where: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for key in sorted(set(x) | set(y)):
                walk(x.get(key), y.get(key), f"{where}.{key}" if where else key)
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{where}[{i}]")
        elif json.dumps(x) != json.dumps(y):
            found.append(where or "(all)")

    walk(json.loads(left), json.loads(right), "")
    return found


def report_table(run: Path, out: Path, clocks: Sequence[str]) -> list[list[str]]:
    """The table `esbox report` prints, its ``clocks`` columns blanked."""
    result = CliRunner().invoke(cli, ["report", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [line.split("|") for line in result.output.splitlines() if line.startswith("|")]
    columns = [i for i, cell in enumerate(rows[0]) if cell.strip() in clocks]
    return [["" if i in columns else cell for i, cell in enumerate(row)] for row in rows]
