"""``esbox.optimize``'s result prints short, whatever the length of the run; the history stays."""

from __future__ import annotations

import esbox
from esbox.adapters.functions import get_function


def test_result_prints_a_short_summary_and_keeps_the_history():
    rastrigin = get_function("rastrigin")
    x0 = rastrigin.default_x0(200, seed=0)
    result = esbox.optimize(rastrigin, x0, strategy="copes", budget=3_000, seed=0)
    text = repr(result)
    assert str(result) == text
    assert len(text) < 600  # the README example printed about 300 KB before
    lines = dict(line.strip().split(": ", 1) for line in text.splitlines())
    assert float(lines["best_value"]) == float(f"{result.best_value:.6g}")
    assert lines["evaluations"] == str(result.evaluations) and result.evaluations <= 3_000
    assert lines["steps"] == str(result.steps)
    assert lines["stop_reason"] == result.stop_reason
    assert lines["strategy"] == "copes"
    assert lines["history"].startswith(f"{len(result.history)} steps in .history")
    assert len(result.history) == result.steps > 0
    assert all("step" in metrics for metrics in result.history)
