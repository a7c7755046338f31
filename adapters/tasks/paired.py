"""Two models on the same questions: the change in accuracy with its paired standard error (the
SE of the mean per-question difference), and the questions gained and lost.

Pairing removes the between-question variance that both models share: the SE of a difference
of two unpaired accuracies would count it twice. ``docs/agents.md`` shows it in use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean: the sample SD (n - 1) over sqrt(n); NaN below 2 values."""
    n = len(values)
    if n < 2:
        return math.nan
    mean = math.fsum(values) / n
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return math.sqrt(variance / n)


def paired_change(reference: Sequence[bool], other: Sequence[bool]) -> dict[str, float]:
    """``other`` against ``reference``, question by question: the accuracy change, its paired
    SE, and how many questions ``other`` gets right that ``reference`` does not (and back)."""
    if len(reference) != len(other):
        raise ValueError(
            f"a paired change needs the same questions: {len(reference)} against {len(other)}"
        )
    if not reference:
        raise ValueError("no questions")
    differences = [float(b) - float(a) for a, b in zip(reference, other, strict=True)]
    return {
        "change": math.fsum(differences) / len(differences),
        "change_se": standard_error(differences),
        "gained": float(sum(d > 0 for d in differences)),
        "lost": float(sum(d < 0 for d in differences)),
    }
