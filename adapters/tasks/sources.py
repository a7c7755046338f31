"""Where a task's rows come from, and which of their columns it reads.

A source is a local file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``), a directory written by
``datasets``' ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` of which ``split`` is read),
or a ``datasets.load_dataset`` call (a builder such as ``json``/``csv``/``parquet`` over local
``data_files``, or a dataset name with a local cache). ``columns`` maps a task's fields to the
source's column names (``{question: problem, answer: solution}``).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from esbox.errors import ConfigError, close_match_hint, unknown_key_message

from .base import read_rows

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
# datasets' builders of local files: a name close to one of them is a typo, not a hub dataset
BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas")

# The fields each row-task format reads, and the option naming the column of each.
FIELDS: dict[str, dict[str, str]] = {
    "math": {"question": "question_key", "answer": "answer_key"},
    "qa": {"question": "question_key", "answers": "answers_key", "context": "context_key"},
}
OPTIONAL_FIELDS = {"context"}  # read when present (QATask's context_key)


def require_datasets() -> Any:
    """The ``datasets`` module, or an ImportError naming the package to install."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            "a task from a datasets dataset needs the datasets package: pip install datasets "
            "(part of esbox[llm])"
        ) from exc
    return datasets


def read_source(
    path: str | Path, *, split: str = "train", limit: int | None = None
) -> list[dict[str, Any]]:
    """The rows of a local file or of a dataset saved with ``save_to_disk`` (its ``split``)."""
    p = Path(path).expanduser()
    if p.is_dir():
        try:
            saved = require_datasets().load_from_disk(str(p))
        except FileNotFoundError:
            raise ConfigError(
                f"task data {p} is a directory but not a dataset saved with datasets' "
                f"save_to_disk; give a {'/'.join(SUFFIXES)} file or such a directory"
            ) from None
        return dataset_rows(saved, split, str(p), limit)
    if not p.is_file():
        raise ConfigError(f"task data {p} does not exist")
    if p.suffix.lower() not in SUFFIXES:
        raise ConfigError(
            f"task data {p}: unknown file type '{p.suffix}' (allowed: {', '.join(SUFFIXES)}, "
            f"or a directory saved with datasets' save_to_disk)"
        )
    if p.suffix.lower() == ".csv":
        with p.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        return rows[:limit] if limit is not None else rows
    return read_rows(p, limit)


def load_dataset(
    name: str, config: str | None = None, *, data_files: Any = None, cache_dir: str | None = None
) -> Any:
    """``datasets.load_dataset(name, config, data_files=...)``: all its splits.

    With a builder name (``json``, ``csv``, ``parquet``) and local ``data_files`` nothing is
    downloaded; a hub name needs network or a local cache. A name that is neither, or data
    files that are not there, is a ConfigError naming the key.
    """
    datasets = require_datasets()
    if "/" not in name and name not in BUILDERS and not Path(name).exists():
        hint = close_match_hint(name, BUILDERS)
        if hint:  # a misspelt builder: say so before datasets spends half a minute on the hub
            raise ConfigError(f"task name '{name}' is not a datasets builder{hint}")
    try:
        return datasets.load_dataset(name, config, data_files=data_files, cache_dir=cache_dir)
    except (FileNotFoundError, ConnectionError) as exc:
        raise ConfigError(
            f"task name '{name}' (data_files {data_files!r:.200}) could not be loaded: {exc}. "
            f"name is a builder of local data_files ({', '.join(BUILDERS)}), a local "
            f"directory or a hub dataset in the local cache"
        ) from None


def dataset_rows(loaded: Any, split: str, where: str, limit: int | None) -> list[dict[str, Any]]:
    """The rows of a ``Dataset``, or of split ``split`` of a ``DatasetDict``."""
    if hasattr(loaded, "keys"):  # a DatasetDict: one dataset per split
        if split not in loaded:
            raise ConfigError(unknown_key_message(f"split of {where}", split, loaded.keys()))
        loaded = loaded[split]
    if limit is not None:
        loaded = loaded.select(range(min(limit, len(loaded))))
    return list(loaded)


def column_options(fmt: str, columns: Mapping[str, Any], options: Mapping[str, Any]) -> dict:
    """``columns`` (task field -> column) as the task's ``*_key`` options."""
    fields = FIELDS[fmt]
    if not isinstance(columns, Mapping):
        raise ConfigError(f"task columns must be a mapping of field: column, got {columns!r}")
    keys: dict[str, Any] = {}
    for field, column in columns.items():
        if field not in fields:
            raise ConfigError(unknown_key_message(f"{fmt} task column field", field, fields))
        if not isinstance(column, str) or not column:
            raise ConfigError(f"task columns.{field} must be a column name, got {column!r}")
        if fields[field] in options:
            raise ConfigError(
                f"task columns.{field} and {fields[field]} both name the {field} column: "
                f"give one of them"
            )
        keys[fields[field]] = column
    return keys


def check_columns(
    rows: Sequence[Mapping[str, Any]],
    fmt: str,
    options: Mapping[str, Any],
    where: str,
    mapped: Sequence[str] = (),
) -> None:
    """ConfigError naming a column the task reads that ``rows`` lack, and the columns they have.

    Every field of ``fmt`` is needed except the optional ones (unless named in ``mapped``).
    """
    if not rows:
        raise ConfigError(f"task data {where} has no rows")
    for field, key in FIELDS[fmt].items():
        column = options.get(key, field)
        if column is None or (field in OPTIONAL_FIELDS and field not in mapped):
            continue
        for number, row in enumerate(rows, 1):
            if column not in row:
                have = ", ".join(map(str, row)) or "none"
                at = "" if number == 1 else f" (row {number})"
                raise ConfigError(
                    f"task data {where}{at} has no column '{column}' for the {field}; its "
                    f"columns: {have}. Map the task's fields with columns: "
                    f"{{{field}: COLUMN, ...}}"
                )
