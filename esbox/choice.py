"""``strategy="auto"``: the strategy ``esbox.optimize`` picks by dimension and budget, as
nevergrad's NGOpt picks its algorithm (the rule and its measurements: docs/strategies.md).

* d <= ``FULL_CMA_MAX`` and at least ``CMA_MIN_BUDGET`` d evaluations: full CMA-ES (``cma``,
  pycma) — it learns a full covariance, which pays once the budget is large against d;
* d <= ``SEP_CMA_MAX`` with that budget: sep-CMA-ES (``cma`` with ``diagonal: true``), O(d)
  a sample, where a d x d covariance would cost more than the function;
* otherwise (a small budget against d, a larger d, or no pycma): esbox's ES. ``openai_es`` where
  d > ``OPENAI_ES_MIN_DIMENSION`` and the budget is at least ``OPENAI_ES_MIN_BUDGET`` d (on
  COCO's bbob-largescale instances 1-3 at 100 d it is at or above every peer at d = 80, 160
  and 320, where ``esopt`` is one or two triples below at 160 and 320; on the held-out instances
  4-6 above every peer at 160 and one triple below pycma IPOP at 320); else ``esopt``, the best
  esbox strategy of the quality suite at budgets of d to 50 d evaluations and the best of all at
  d = 80 on bbob-largescale.

Each runs with the vector defaults, IPOP restarts included.
"""

from __future__ import annotations

import importlib.util
from typing import Any

FULL_CMA_MAX = 1000
SEP_CMA_MAX = 10_000
CMA_MIN_BUDGET = 1000  # evaluations per dimension (COCO: below it ES is at least as good)
OPENAI_ES_MIN_DIMENSION = 100  # chosen on bbob-largescale instances 1-3, between d = 80 and 160
OPENAI_ES_MIN_BUDGET = 100  # evaluations per dimension: the budget that choice was measured at


def has_pycma() -> bool:
    return importlib.util.find_spec("cma") is not None


def choose_strategy(
    dimension: int, max_evaluations: int | None, pycma: bool | None = None
) -> tuple[str, dict[str, Any], str]:
    """(strategy, its options, the strategy as ``Result.strategy`` shows it) for a
    ``dimension``-d vector and a budget of ``max_evaluations`` (None: unlimited)."""
    pycma = has_pycma() if pycma is None else pycma
    room = _at_least(max_evaluations, CMA_MIN_BUDGET * dimension)
    if pycma and room and dimension <= FULL_CMA_MAX:
        return "cma", {}, "auto: cma"
    if pycma and room and dimension <= SEP_CMA_MAX:
        return "cma", {"diagonal": True}, "auto: cma (diagonal)"
    long = _at_least(max_evaluations, OPENAI_ES_MIN_BUDGET * dimension)
    if dimension > OPENAI_ES_MIN_DIMENSION and long:
        return "openai_es", {}, "auto: openai_es"
    return "esopt", {}, "auto: esopt"


def _at_least(max_evaluations: int | None, evaluations: int) -> bool:
    """Whether a budget (None: unlimited) allows ``evaluations``."""
    return max_evaluations is None or max_evaluations >= evaluations
