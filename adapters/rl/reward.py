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
        pairs = zip(completions, example, strict=True)
        return self.record([self._one(c, self.task.train[i]) for c, i in pairs])

    def _one(self, completion: str, example: Any) -> float:
        try:
            return float(self.task.reward(truncate_at_stop(completion, self.task.stop), example))
        except Exception:  # a broken reward must not stop training, as in ES rollouts
            return math.nan

    def record(self, rewards: Sequence[float]) -> list[float | None]:
        """Count and keep the rewards of a batch; TRL's form of them (None where not finite)."""
        kept = [r if math.isfinite(r) else None for r in rewards]
        self.samples += len(kept)
        self.errors += sum(r is None for r in kept)
        self._pending.extend(r for r in kept if r is not None)
        return kept

    def drain(self) -> list[float]:
        """The rewards scored since the last call."""
        pending, self._pending = self._pending, []
        return pending
