"""Metrics tracking: a Runner callback writing one JSON object per step to a JSONL file.

Each line is written and flushed as soon as the step ends, so a killed run keeps every
finished step. Non-finite numbers are written as ``null`` (strict JSON). After a resume the
file is rewritten from the checkpoint's history, dropping steps the checkpoint did not see, and
so is it after Ctrl-C (which checkpoints a step that ended before its callbacks logged it).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

# The fields every record carries, in this order; any other metric follows them.
FIELDS = (
    "step",
    "evaluations",
    "reward_mean",
    "reward_max",
    "reward_min",
    "reward_std",
    "best_reward",
    "best_value",
    "sigma",
    "learning_rate",
    "wall_seconds",
    "update_norm",
)


def jsonable(value: Any) -> Any:
    """``value`` as strict-JSON data: non-finite floats become None, numpy scalars Python."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return jsonable(value.item())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def record(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The JSONL record of one step's metrics: FIELDS first (null when absent), then extras."""
    row = {key: jsonable(metrics.get(key)) for key in FIELDS}
    row.update({key: jsonable(value) for key, value in metrics.items() if key not in row})
    return row


class MetricsLogger:
    """Runner callback ``logger(runner, metrics)`` appending a record per step to ``path``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._handle: IO[str] | None = None

    def __call__(self, runner: Any, metrics: Mapping[str, Any]) -> None:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a", encoding="utf-8")
        self._handle.write(json.dumps(record(metrics)) + "\n")
        self._handle.flush()

    def rewrite(self, history: Iterable[Mapping[str, Any]]) -> None:
        """Replace the file atomically by the records of ``history`` (after a resume or an
        interrupt)."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for metrics in history:
                handle.write(json.dumps(record(metrics)) + "\n")
        os.replace(tmp, self.path)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics file; a torn last line (a run killed mid-write) is skipped."""
    rows = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}: line {number} is not valid JSON") from None
    return rows
