"""Evaluators score a population: each member in turn inside one ``space.sweep``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from esbox.errors import check_reward_values
from esbox.space import ParameterSpace, VectorSpace
from esbox.specs import Perturbation


@runtime_checkable
class Evaluator(Protocol):
    """Returns one reward per perturbation (higher is better); leaves the space unperturbed."""

    def evaluate(self, space: ParameterSpace, perturbations: Sequence[Perturbation]) -> np.ndarray:
        """Rewards of the population, in order."""
        ...


class FunctionEvaluator:
    """Scores vectors with a black-box function of one vector, or of a batch when ``batched``.

    Costs are negated when ``minimize``. A value that is not a number (None, a string) raises
    ``RewardTypeError`` at once; NaN and +-inf are passed on (the Runner's rule applies).
    The best vector seen is kept (copied on improvement).
    In batched mode at most ``batch_size`` perturbed vectors exist at once.
    """

    def __init__(
        self,
        fn: Callable[[np.ndarray], Any],
        *,
        minimize: bool = True,
        batched: bool = False,
        batch_size: int = 64,
    ) -> None:
        self.fn = fn
        self.sign = -1.0 if minimize else 1.0
        self.batched = batched
        self.batch_size = batch_size
        self.best_value = np.inf if minimize else -np.inf
        self.best_x: np.ndarray | None = None

    def _better(self, value: float) -> bool:
        return np.isfinite(value) and self.sign * value > self.sign * self.best_value

    def _record(self, value: float, x: np.ndarray) -> None:
        if not self._better(value):
            return
        self.best_value = float(value)
        if self.best_x is not None and self.best_x.shape == np.shape(x):
            np.copyto(self.best_x, x)  # in place: never two d-sized copies at once
        else:
            self.best_x = np.array(x, copy=True)

    def evaluate(self, space: ParameterSpace, perturbations: Sequence[Perturbation]) -> np.ndarray:
        if not isinstance(space, VectorSpace):
            raise TypeError("FunctionEvaluator needs a VectorSpace")
        values = np.empty(len(perturbations))
        if self.batched:
            for lo in range(0, len(perturbations), self.batch_size):
                with space.sweep(perturbations[lo : lo + self.batch_size]) as members:
                    batch = np.stack([space.vector.copy() for _ in members])
                out = self.fn(batch)
                check_reward_values(out, "the batched function")
                out = np.asarray(out, dtype=np.float64).reshape(-1)
                if out.size != len(batch):
                    raise ValueError(
                        f"batched function returned {out.size} values for {len(batch)} inputs"
                    )
                values[lo : lo + len(batch)] = out
                for value, x in zip(out, batch, strict=True):
                    self._record(float(value), x)
        else:
            with space.sweep(perturbations) as members:
                for i, _ in enumerate(members):
                    values[i] = _scalar(self.fn(space.vector))
                    if self._better(values[i]):
                        self._record(values[i], space.vector)
        return self.sign * values

    def state_dict(self) -> dict[str, Any]:
        tensors = {"best_x": torch.from_numpy(self.best_x)} if self.best_x is not None else {}
        return {"best_value": self.best_value, "tensors": tensors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_value = float(state["best_value"])
        best = state["tensors"].get("best_x")
        self.best_x = best.numpy().copy() if best is not None else None


def _scalar(value: Any) -> float:
    check_reward_values(value, "the function")
    array = np.asarray(value, dtype=np.float64)
    if array.size != 1:
        raise ValueError(
            f"the function returned {array.size} values for one input; "
            f"pass batched=True if it takes a batch"
        )
    return float(array.reshape(()))
