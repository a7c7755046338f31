"""One short LLM run of the copes suite in a fresh process: a shipped arithmetic config
(``examples/llm-arith*.yaml``, SmolLM2-135M) with a seed, a step count and option overrides.

Returns the held-out accuracy before and after, the mean training reward of every step and
the seconds per step. The parent is :mod:`benchmarks.copes` (``--llm``).
"""

from __future__ import annotations

from typing import Any

from benchmarks import measure


def child_llm(
    config: str, seed: int, steps: int, heldout: int, threads: int, overrides: list[str]
) -> dict[str, Any]:
    """Build the run from ``config`` with the overrides, run ``steps`` updates, report."""
    from esbox.adapters.problems import load_run

    session = load_run(
        measure.ROOT / config,
        overrides=[
            f"seed={seed}",
            f"budget.max_steps={steps}",
            "budget.max_seconds=null",
            f"problem.validation_every={steps}",
            f"problem.validation_limit={heldout}",
            f"problem.threads={threads}",
            *overrides,
        ],
    )
    runner = session.runner()
    elapsed = measure.stopwatch()
    reason = runner.run()
    seconds = elapsed()
    history = runner.history
    baseline = next(
        (c.baseline for c in session.problem.callbacks if getattr(c, "baseline", None)), {}
    )
    final = next((m for m in reversed(history) if "val_accuracy" in m), {})
    return {
        "stop": reason,
        "steps": len(history),
        "evaluations": runner.evaluations,
        "reward": [m["reward_mean"] for m in history],
        "val_before": baseline.get("val_accuracy"),
        "val_after": final.get("val_accuracy"),
        "seconds": seconds,
    }


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    spec = dict(spec)
    spec.pop("kind", None)
    return child_llm(**spec)


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(serve))
