"""Reading a run's ``trajectories.jsonl`` back: pick records by step and member, and write one
out as a conversation a person can read (``esbox trajectories``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_FIGURES = (
    "turns", "tokens", "calls", "valid_calls", "tool_errors", "stop", "reward", "correct"
)  # fmt: skip


def read_trajectories(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a trajectories file, in the order written; ValueError names a bad line."""
    records = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{path}:{number} is not a JSON line ({exc})") from None
    return records


def select(
    records: Iterable[dict[str, Any]], step: int | None = None, member: int | None = None
) -> list[dict[str, Any]]:
    """The records of ``step`` (negative counts from the last step logged) and ``member``."""
    records = list(records)
    steps = sorted({r["step"] for r in records})
    if step is not None and step < 0:
        if -step > len(steps):
            return []
        step = steps[step]
    return [
        r
        for r in records
        if (step is None or r["step"] == step) and (member is None or r.get("member") == member)
    ]


def is_heuristic(record: dict[str, Any]) -> bool:
    """An AHD run's record: one heuristic scored on one example, not a member's conversation."""
    return "code" in record and "messages" not in record


def format_trajectory(record: dict[str, Any]) -> str:
    """A header (step, member, gold, figures) and each message with its role; an AHD record's
    header has its example, score and error, then the code."""
    if is_heuristic(record):
        return _format_heuristic(record)
    figures = ", ".join(f"{k} {record[k]}" for k in _FIGURES if k in record)
    where = (
        f"step {record.get('step')} member {record.get('member')}"
        if "step" in record
        else f"question {record.get('index')} sample {record.get('sample')}"
    )
    lines = [
        f"== {where}: gold {record.get('gold')!r}, final {record.get('final')!r}",
        f"   {figures}",
    ]
    lines += [f"   protocol error: {error}" for error in record.get("errors", [])]
    for message in record.get("messages", []):
        role = message.get("role", "?")
        if role == "system":
            continue  # the same tool prompt in every record; --system shows it
        lines.append(f"-- {role}")
        lines.append(str(message.get("content", "")).rstrip())
    return "\n".join(lines)


def _format_heuristic(record: dict[str, Any]) -> str:
    cost = record.get("cost")
    quality = "no valid solution" if cost is None else f"cost {cost:g}"
    return "\n".join(
        [
            f"== step {record.get('step')} {record.get('split')} example {record.get('index')}: "
            f"reward {record.get('reward')}, {quality} against the reference's "
            f"{record.get('reference'):g}, scored {record.get('times', 1)} times",
            f"   error: {record['error']}" if record.get("error") else "   no error",
            "-- code",
            str(record.get("code") or "").rstrip(),
        ]
    )


def system_prompt_of(record: dict[str, Any]) -> str:
    """The system message the model read (tool prompt included; '' when it had none)."""
    if record.get("system"):
        return str(record["system"])
    for message in record.get("messages", []):
        if message.get("role") == "system":
            return str(message.get("content", ""))
    return ""
