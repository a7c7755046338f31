"""A live progress bar as a Runner callback: step, best value, evaluations per second."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

from esbox.runner import Budget


def expected_steps(budget: Budget, population: int) -> int | None:
    """How many steps the budget allows, when that is known in advance."""
    limits = []
    if budget.max_steps is not None:
        limits.append(budget.max_steps)
    if budget.max_evaluations is not None:
        limits.append(budget.max_evaluations // max(population, 1))
    return min(limits) if limits else None


class ProgressBar:
    """``bar(runner, metrics)`` after each step; silent with ``quiet`` or when not a TTY."""

    def __init__(self, budget: Budget, population: int, initial: int, *, quiet: bool) -> None:
        self.bar = tqdm(
            total=expected_steps(budget, population),
            initial=initial,
            unit="step",
            dynamic_ncols=True,
            disable=True if quiet else None,
            leave=False,
        )

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        self.bar.update(1)
        best = metrics.get("best_value", metrics.get("best_reward"))
        seconds = metrics.get("wall_seconds") or 0.0
        rate = metrics["evaluations"] / seconds if seconds > 0 else 0.0
        self.bar.set_postfix(
            {"best": f"{best:.6g}", "evals": metrics["evaluations"], "evals/s": f"{rate:.0f}"}
        )

    def close(self) -> None:
        self.bar.close()
