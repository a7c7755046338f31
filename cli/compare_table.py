"""The side-by-side table of ``esbox evaluate RUN_DIR ...``: one row a model, the first model the
reference of the paired changes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# the agent's tool-use figures, in the order the table shows them; rates print as percentages
TOOL_FIGURES = ("tool_call_rate", "valid_call_rate", "answer_rate", "turns",
                "trajectory_tokens", "tool_errors")  # fmt: skip
RATES = {"tool_call_rate", "valid_call_rate", "answer_rate"}


def comparison(models: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Per ``(name, ModelScore)``: its figures, the SE of its accuracy and its paired change
    against the first model (None for the first)."""
    from esbox.adapters.tasks.paired import paired_change, standard_error

    first, reference = models[0][0], models[0][1].correct
    rows = []
    for i, (name, score) in enumerate(models):
        change = {"against": first, **paired_change(reference, score.correct)} if i else None
        rows.append({
            "name": name,
            "figures": score.figures,
            "accuracy_se": standard_error([float(c) for c in score.correct]),
            "change": change,
        })  # fmt: skip
    return rows


def _percent(value: float, se: float | None = None, sign: bool = False) -> str:
    text = f"{100 * value:+.1f}" if sign else f"{100 * value:.1f}%"
    return text if se is None or math.isnan(se) else f"{text} ({100 * se:.1f})"


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table: accuracy (SE), change vs the first model in points (paired SE),
    questions gained / lost, mean reward, pass@k, and the tool-use figures where scored."""
    figures = rows[0]["figures"]
    passes = [k for k in figures if k.startswith("pass@") and k != "pass@1"]
    tools = [k for k in TOOL_FIGURES if k in figures]
    against = rows[1]["change"]["against"] if len(rows) > 1 else rows[0]["name"]
    header = ["model", "n", "accuracy (SE)", f"vs {against}, points (paired SE)",
              "gained / lost", "mean reward", *passes, *tools]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row in rows:
        values, change = row["figures"], row["change"]
        cells = [
            row["name"],
            f"{values['n']:.0f}",
            _percent(values["accuracy"], row["accuracy_se"]),
            "—" if change is None else _percent(change["change"], change["change_se"], True),
            "—" if change is None else f"{change['gained']:.0f} / {change['lost']:.0f}",
            f"{values['mean_reward']:.4g}",
            *(_percent(values[k]) for k in passes),
            *(_percent(values[k]) if k in RATES else f"{values[k]:.4g}" for k in tools),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
