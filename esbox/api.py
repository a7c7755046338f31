"""``esbox.optimize``: minimize or maximize a black-box function of a vector with any strategy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from esbox.choice import choose_strategy
from esbox.errors import ConfigError
from esbox.evaluation import FunctionEvaluator
from esbox.registry import make_strategy
from esbox.restarts import restarting, uniform_start
from esbox.runner import Budget, Callback, Runner
from esbox.space import DEFAULT_CHUNK_SIZE, VectorSpace


@dataclass(repr=False)
class Result:
    """What a run found and why it stopped. It prints as a short summary, as scipy's
    ``OptimizeResult`` and pycma's result do; ``history`` holds every step's metrics."""

    x: np.ndarray
    best_x: np.ndarray | None
    best_value: float
    evaluations: int
    steps: int
    stop_reason: str
    history: list[dict[str, Any]] = field(default_factory=list)
    strategy: str = ""
    restarts: list[dict[str, Any]] = field(default_factory=list)  # one record per ended restart

    def __repr__(self) -> str:
        fields = {
            "best_value": f"{self.best_value:.6g}",
            "evaluations": str(self.evaluations),
            "steps": str(self.steps),
            "stop_reason": self.stop_reason,
            "strategy": self.strategy or "-",
            "restarts": f"{len(self.restarts)} (.restarts: why each ended)",
            "x": f"array of {self.x.size} ({self.x.dtype})",
            "best_x": "None" if self.best_x is None else f"array of {self.best_x.size}",
            "history": f"{len(self.history)} steps in .history (one dict of metrics a step)",
        }
        width = max(map(len, fields))
        return "\n".join(f"{name:>{width}}: {value}" for name, value in fields.items())


def optimize(
    fn: Callable[[np.ndarray], Any],
    x0: np.ndarray | Sequence[float],
    strategy: str = "auto",
    *,
    budget: int | Budget | None = None,
    max_steps: int | None = None,
    max_time: float | None = None,
    minimize: bool = True,
    seed: int = 0,
    batched: bool = False,
    batch_size: int = 64,
    dtype: str = "float64",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    callbacks: Sequence[Callback] = (),
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 10,
    resume: str | Path | None = None,
    progress: bool = False,
    max_nonfinite_steps: int = 1,
    restarts: Any = "auto",
    bounds: tuple[Any, Any] | None = None,
    **strategy_options: Any,
) -> Result:
    """Optimize ``fn`` from ``x0`` with strategy ``strategy`` (``auto``: picked by d and the
    budget, see ``esbox.choice``; ``Result.strategy`` names the pick).

    ``budget`` counts evaluations (or pass a ``Budget``); ``max_steps``/``max_time`` add step and
    wall-time limits. ``fn`` takes one vector, or a (B, d) batch when ``batched``. With
    ``resume=DIR`` the run continues bit-identically from the newest checkpoint in DIR.
    A value of ``fn`` that is not a number raises ``RewardTypeError``; ``max_nonfinite_steps``
    steps in a row where every value is NaN or +-inf raise ``RewardError``. A budget smaller
    than one step is a ``ConfigError``. ``restarts`` (a kind, ``ipop``, ``bipop``, ``stop`` or
    ``none``, or a mapping of ``esbox.restarts.RestartOptions``) says what happens when sigma
    collapses or progress stops: by default (``auto``) an IPOP restart from a new start point;
    ``best_value`` is the best over all restarts, and after a restart ``x`` is ``best_x``.
    ``bounds`` (lower, upper: numbers or length-d vectors) is the box the optimum is sought in,
    as COCO's domain: restarts then start uniformly inside it, and where ``auto`` picks CMA-ES
    without a given ``sigma``, sigma_0 is a fifth of the box's mean width (pycma's advice).
    """
    if not isinstance(budget, Budget):
        budget = Budget(max_evaluations=budget, max_steps=max_steps, max_seconds=max_time)
    space = VectorSpace(x0, dtype=dtype, chunk_size=chunk_size)
    box = None if bounds is None else _box(bounds, space.dimension)
    label = strategy
    if strategy == "auto":
        strategy, picked, label = choose_strategy(space.dimension, budget.max_evaluations)
        if box is not None and strategy == "cma":
            picked = {**picked, "sigma": float(np.mean(box[1] - box[0])) / 5.0}
        strategy_options = {**picked, **strategy_options}

    def build(run_seed: int, **overrides: Any) -> Any:
        return make_strategy(strategy, space, seed=run_seed, **{**strategy_options, **overrides})

    start = None if box is None else uniform_start(*box)
    es = restarting(build, space, restarts, seed=seed, x0_start=start)
    evaluator = FunctionEvaluator(fn, minimize=minimize, batched=batched, batch_size=batch_size)
    runner = Runner(
        space,
        es,
        evaluator,
        budget,
        callbacks=callbacks,
        checkpoint_dir=checkpoint_dir or resume,
        checkpoint_every=checkpoint_every if (checkpoint_dir or resume) else 0,
        progress=progress,
        max_nonfinite_steps=max_nonfinite_steps,
    )
    if resume is not None:
        runner.resume(resume)
    reason = runner.run()
    log = [dict(r) for r in getattr(es, "restart_log", ())]
    x = space.vector.copy()
    if log and evaluator.best_x is not None:  # the last restart's point may be unfinished
        x = evaluator.best_x.copy()
    return Result(
        x=x,
        best_x=evaluator.best_x,
        best_value=evaluator.best_value,
        evaluations=runner.evaluations,
        steps=es.step,
        stop_reason=reason,
        history=runner.history,
        strategy=label,
        restarts=log,
    )


def _box(bounds: Any, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """``bounds`` as two length-d vectors with lower < upper, else a ConfigError naming it."""
    try:
        lower, upper = (
            np.broadcast_to(np.asarray(b, dtype=np.float64), (dimension,)) for b in bounds
        )
    except (TypeError, ValueError):
        raise ConfigError(
            f"bounds must be (lower, upper), each a number or a vector of length {dimension}, "
            f"got {bounds!r}"
        ) from None
    if not (np.all(np.isfinite(lower)) and np.all(np.isfinite(upper)) and np.all(lower < upper)):
        raise ConfigError("bounds: every lower bound must be finite and below its upper bound")
    return lower.copy(), upper.copy()
