"""A task from its config mapping (``problem.task``): local files, synthetic, or ``datasets``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from esbox.errors import ConfigError

from .arithmetic import ArithmeticTask
from .base import Task
from .math_problems import MathTask
from .multihop import MultiHopQATask
from .qa import QATask
from .sources import FIELDS, check_columns, column_options, dataset_rows, load_dataset, read_source
from .tool_math import ToolMathTask

TASK_KINDS = (
    "arithmetic", "math", "qa", "tool_math", "tool_chain", "multihop_qa", "datasets",
    "reasoning_gym", "textarena", "ahd_binpacking", "ahd_tsp",
)  # fmt: skip
ENVIRONMENT_KINDS = ("textarena",)  # tasks whose trajectories play an environment


def load_task(spec: Mapping[str, Any]) -> Task:
    """Build a task from a config mapping; ``kind`` is one of :data:`TASK_KINDS`.

    * ``{"kind": "arithmetic", "digits": 2, "ops": ["+"], "seed": 0}``
    * ``{"kind": "tool_math", "families": ["product", "sum"], "seed": 0}``
    * ``{"kind": "tool_chain", "horizon": 4, "branching": False}``: h dependent calculator steps
    * ``{"kind": "reasoning_gym", "name": "chain_sum", "size": 1000, "seed": 0, "config": {}}``
    * ``{"kind": "textarena", "id": "Sudoku-v0", "kwargs": {"clues": 77, "max_turns": 8}}``
      (episodes of a game, for agent runs)
    * ``{"kind": "ahd_binpacking", "n_items": 100, "capacity": 100, "instances": 4}`` or
      ``{"kind": "ahd_tsp", "n_cities": 30}``: the model writes a heuristic, run in the sandbox
    * ``{"kind": "multihop_qa", "kb_seed": 0}`` (the synthetic 2-hop base) or
      ``{"kind": "multihop_qa", "path": "hotpot.jsonl", "corpus_path": "docs.jsonl"}``
    * ``{"kind": "math", "path": "train.jsonl", "heldout_path": "test.jsonl",
      "format_weight": 0.1}``; ``path`` may be a JSONL/JSON/Parquet/CSV file or a directory
      saved by ``datasets`` (``split``/``heldout_split`` pick from a ``DatasetDict``)
    * ``{"kind": "qa", "path": "qa.csv", "metric": "em", "columns": {"answers": "gold"}}``
    * ``{"kind": "datasets", "name": "json", "data_files": {"train": "a.jsonl"},
      "split": "train", "heldout_split": "test", "format": "math"}``: ``datasets.load_dataset``;
      other keys go to the math/QA task.

    ``columns`` maps the task's fields (math: question, answer; qa: question, answers, context)
    to the data's column names.
    """
    opts = dict(spec)
    kind = opts.pop("kind", None)
    try:
        return _build_task(kind, opts)
    except TypeError as exc:  # an unknown or missing option: name it, like a config error
        raise ConfigError(f"task (kind {kind!r}): {exc}") from None
    except KeyError as exc:
        raise ConfigError(f"task (kind {kind!r}) needs the option {exc}") from None


def _build_task(kind: Any, opts: dict[str, Any]) -> Task:
    if kind == "arithmetic":
        return ArithmeticTask(**opts)
    if kind == "tool_math":
        return ToolMathTask(**opts)
    if kind == "tool_chain":
        from .chain import ToolChainTask

        return ToolChainTask(**opts)
    if kind == "reasoning_gym":
        from .reasoning_gym import ReasoningGymTask

        return ReasoningGymTask(**opts)
    if kind == "textarena":
        from .games import TextArenaTask

        return TextArenaTask(**opts)
    if kind in ("ahd_binpacking", "ahd_tsp"):
        from .ahd_binpacking import BinPackingTask
        from .ahd_tsp import TSPTask

        return (BinPackingTask if kind == "ahd_binpacking" else TSPTask)(**opts)
    if kind == "multihop_qa":
        if "path" in opts:
            return MultiHopQATask.from_files(
                opts.pop("path"), opts.pop("heldout_path", None), **opts
            )
        return MultiHopQATask.synthetic(**opts)
    if kind in ("math", "qa"):
        path, heldout_path = opts.pop("path"), opts.pop("heldout_path", None)
        split, heldout_split = opts.pop("split", "train"), opts.pop("heldout_split", None)
        limit = opts.pop("limit", None)
        train = read_source(path, split=split, limit=limit)
        held = None
        if heldout_path is not None or heldout_split is not None:
            held = read_source(heldout_path or path, split=heldout_split or split, limit=limit)
        return _row_task(kind, train, held, str(path), opts)
    if kind == "datasets":
        name, fmt = opts.pop("name"), opts.pop("format", "math")
        if fmt not in FIELDS:
            raise ConfigError(f"task format must be 'math' or 'qa', got {fmt!r}")
        loaded = load_dataset(
            name,
            opts.pop("config", None),
            data_files=opts.pop("data_files", None),
            cache_dir=opts.pop("cache_dir", None),
        )
        split, heldout_split = opts.pop("split", "train"), opts.pop("heldout_split", None)
        limit = opts.pop("limit", None)
        train = dataset_rows(loaded, split, name, limit)
        held = dataset_rows(loaded, heldout_split, name, limit) if heldout_split else None
        opts["name"] = opts.pop("task_name", name)
        return _row_task(fmt, train, held, name, opts)
    raise ConfigError(f"unknown task kind {kind!r}; use one of {', '.join(TASK_KINDS)}")


def _row_task(
    fmt: str,
    train: Sequence[Mapping[str, Any]],
    held: Sequence[Mapping[str, Any]] | None,
    where: str,
    opts: dict[str, Any],
) -> Task:
    """A math or QA task over rows, after mapping and checking the columns it reads."""
    columns = opts.pop("columns", None) or {}
    opts.update(column_options(fmt, columns, opts))
    check_columns(train, fmt, opts, where, mapped=list(columns))
    if held is not None:
        check_columns(held, fmt, opts, f"{where} (held-out)", mapped=list(columns))
    return (MathTask if fmt == "math" else QATask)(train, held, **opts)
