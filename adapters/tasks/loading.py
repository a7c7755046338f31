"""A task from its config mapping (``problem.task``): local files, synthetic, or ``datasets``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .arithmetic import ArithmeticTask
from .base import Task
from .math_problems import MathTask
from .multihop import MultiHopQATask
from .qa import QATask
from .tool_math import ToolMathTask

TASK_KINDS = ("arithmetic", "math", "qa", "tool_math", "multihop_qa", "datasets")


def load_datasets_rows(
    name: str, split: str, config: str | None = None, **kwargs: Any
) -> list[dict]:
    """Rows of a Hugging Face ``datasets`` split (needs network or a local cache)."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            "a task from a datasets name needs the datasets package: pip install datasets"
        ) from exc
    return list(datasets.load_dataset(name, config, split=split, **kwargs))


def load_task(spec: Mapping[str, Any]) -> Task:
    """Build a task from a config mapping; ``kind`` is one of :data:`TASK_KINDS`.

    * ``{"kind": "arithmetic", "digits": 2, "ops": ["+"], "seed": 0}``
    * ``{"kind": "tool_math", "families": ["product", "sum"], "seed": 0}``
    * ``{"kind": "multihop_qa", "kb_seed": 0}`` (the synthetic 2-hop base) or
      ``{"kind": "multihop_qa", "path": "hotpot.jsonl", "corpus_path": "docs.jsonl"}``
    * ``{"kind": "math", "path": "train.jsonl", "heldout_path": "test.jsonl",
      "format_weight": 0.1}``
    * ``{"kind": "qa", "path": "qa.jsonl", "metric": "em"}``
    * ``{"kind": "datasets", "name": "openai/gsm8k", "config": "main", "split": "train",
      "heldout_split": "test", "format": "math"}``: other keys go to the math/QA task.
    """
    opts = dict(spec)
    kind = opts.pop("kind", None)
    try:
        return _build_task(kind, opts)
    except TypeError as exc:  # an unknown or missing option: name it, like a config error
        raise ValueError(f"task (kind {kind!r}): {exc}") from None
    except KeyError as exc:
        raise ValueError(f"task (kind {kind!r}) needs the option {exc}") from None


def _build_task(kind: Any, opts: dict[str, Any]) -> Task:
    if kind == "arithmetic":
        return ArithmeticTask(**opts)
    if kind == "tool_math":
        return ToolMathTask(**opts)
    if kind == "multihop_qa":
        if "path" in opts:
            return MultiHopQATask.from_files(opts.pop("path"), opts.pop("heldout_path", None),
                                             **opts)
        return MultiHopQATask.synthetic(**opts)
    if kind in ("math", "qa"):
        cls = MathTask if kind == "math" else QATask
        return cls.from_files(opts.pop("path"), opts.pop("heldout_path", None), **opts)
    if kind == "datasets":
        name, fmt = opts.pop("name"), opts.pop("format", "math")
        config, split = opts.pop("config", None), opts.pop("split", "train")
        heldout_split = opts.pop("heldout_split", None)
        limit = opts.pop("limit", None)
        train = load_datasets_rows(name, split, config)[:limit]
        held = load_datasets_rows(name, heldout_split, config)[:limit] if heldout_split else None
        cls = {"math": MathTask, "qa": QATask}.get(fmt)
        if cls is None:
            raise ValueError(f"datasets format must be 'math' or 'qa', got {fmt!r}")
        return cls(train, held, name=opts.pop("task_name", name), **opts)
    raise ValueError(f"unknown task kind {kind!r}; use one of {', '.join(TASK_KINDS)}")
