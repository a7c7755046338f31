"""The task's reward as a TRL reward function ``f(prompts, completions, **columns)``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from esbox.adapters.generation.backend import truncate_at_stop
from esbox.adapters.tasks.base import Task


class TaskReward:
    """``task.reward`` of each completion, cut at the task's stop strings (an ES rollout stops
    generating there). A reward that raises or is not finite gives None: TRL leaves that
    completion out of its group's baseline and gives it no advantage. It keeps the count of
    completions scored (``samples``) and of failed rewards (``errors``), and the rewards since
    the last :meth:`drain`."""

    __name__ = "task_reward"  # TRL names a reward function's metrics by it

    def __init__(self, task: Task) -> None:
        self.task = task
        self.samples = 0
        self.errors = 0
        self._pending: list[float] = []

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[str], example: Sequence[int], **_: Any
    ) -> list[float | None]:
        rewards = [
            self._one(c, self.task.train[i]) for c, i in zip(completions, example, strict=True)
        ]
        self.samples += len(rewards)
        self._pending.extend(r for r in rewards if r is not None)
        return rewards

    def _one(self, completion: str, example: Any) -> float | None:
        try:
            value = float(self.task.reward(truncate_at_stop(completion, self.task.stop), example))
        except Exception:  # a broken reward must not stop training, as in ES rollouts
            value = math.nan
        if not math.isfinite(value):
            self.errors += 1
            return None
        return value

    def drain(self) -> list[float]:
        """The rewards scored since the last call."""
        pending, self._pending = self._pending, []
        return pending
