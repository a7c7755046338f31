"""Score LLM population members by rollouts on a shared minibatch with a verifiable reward.

Every member of a step sees the same prompts (common random numbers) and, by default, greedy
decoding, so reward differences come from the weight perturbation alone. A reward function
that raises or returns a non-finite value scores that completion as NaN; the member's reward
is then NaN and the strategy's rule applies (worst finite reward of the step, counted in the
``nonfinite_rewards`` metric). An error in generation itself propagates, after the weights
have been restored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from esbox.adapters.generation.backend import GenerationBackend
from esbox.space import ParameterSpace
from esbox.specs import Perturbation

from .base import Example, Task, with_context
from .metrics import evaluate


class RolloutEvaluator:
    """Mean reward of each member over the step's minibatch of ``task`` prompts.

    ``context_of(i)`` (ESOpt co-evolution) returns the text of context ``i``; it is placed as
    a system message before the prompt of every rollout of a member with that context.
    """

    def __init__(
        self,
        task: Task,
        backend: GenerationBackend,
        *,
        batch_size: int = 16,
        seed: int = 0,
        max_new_tokens: int | None = None,
        greedy: bool = True,
        context_of: Callable[[int], str] | None = None,
    ) -> None:
        self.task, self.backend = task, backend
        self.batch_size, self.seed = batch_size, seed
        self.max_new_tokens = max_new_tokens or task.max_new_tokens
        self.greedy = greedy
        self.context_of = context_of
        self.reward_errors = 0

    def _prompts(self, batch: Sequence[Example], context: int | None) -> list[Any]:
        text = None if context is None or self.context_of is None else self.context_of(context)
        return [with_context(e.prompt, text) for e in batch]

    def _reward(self, completion: str, example: Example) -> float:
        try:
            value = float(self.task.reward(completion, example))
        except Exception:  # a broken reward must not stop training: it scores NaN
            self.reward_errors += 1
            return math.nan
        return value if math.isfinite(value) else math.nan

    def rollout(self, batch: Sequence[Example], step: int, context: int | None = None) -> float:
        """Mean reward of the model as it is now on ``batch`` (NaN if any reward failed)."""
        completions = self.backend.generate(
            self._prompts(batch, context),
            prefills=[e.prefill for e in batch],
            max_new_tokens=self.max_new_tokens,
            greedy=self.greedy,
            seed=None if self.greedy else self.seed * 1_000_003 + step,
            stop=list(self.task.stop) or None,
        )
        rewards = [self._reward(c, e) for c, e in zip(completions, batch, strict=True)]
        return float(np.mean(rewards))

    def evaluate(self, space: ParameterSpace, perturbations: Sequence[Perturbation]) -> np.ndarray:
        step = perturbations[0].step
        batch = self.task.sample_batch(step, self.batch_size, self.seed)
        rewards = np.empty(len(perturbations))
        with space.sweep(perturbations) as members:
            for i, p in enumerate(members):
                rewards[i] = self.rollout(batch, step, p.context)
        return rewards


class HeldoutValidation:
    """Runner callback: every ``every`` steps, score the current weights on the held-out split.

    Adds ``val_accuracy``, ``val_mean_reward`` and ``val_pass@k`` (and ``val_step``, the number
    of updates applied) to the step's metrics, so they land in the run's metrics log (register
    it before the logger). ``baseline`` holds the same figures before the first update; it is
    the callback's checkpointed state, so a resumed run still reports it. ``with_context``
    scores the prompts read after the strategy's best context (ESOpt co-evolution; before the
    first step, its first context), as its rollouts would read it.
    """

    def __init__(
        self,
        task: Task,
        backend: GenerationBackend,
        *,
        every: int = 5,
        limit: int | None = None,
        num_samples: int = 1,
        batch_size: int = 64,
        with_context: bool = False,
    ) -> None:
        self.task, self.backend, self.every = task, backend, every
        self.limit, self.num_samples, self.batch_size = limit, num_samples, batch_size
        self.with_context = with_context
        self.baseline: dict[str, float] = {}

    def measure(self, context: str | None = None) -> dict[str, float]:
        """Held-out accuracy, mean reward and pass@k of the weights as they are now (read after
        ``context`` when one is given)."""
        result = evaluate(
            self.task,
            self.backend,
            split="heldout",
            limit=self.limit,
            num_samples=self.num_samples,
            batch_size=self.batch_size,
            context=context,
        )
        return {f"val_{k}": v for k, v in result.items()}

    def _context(self, runner: Any) -> str | None:
        return getattr(runner.strategy, "best_context", None) if self.with_context else None

    def on_start(self, runner: Any) -> None:
        """Score the weights before any update (the baseline), kept in ``self.baseline``."""
        self.baseline = {"val_step": 0, **self.measure(self._context(runner))}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it: the baseline."""
        return {"baseline": dict(self.baseline)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline = dict(state.get("baseline", {}))

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        if self.every and runner.strategy.step % self.every == 0:
            metrics.update(val_step=runner.strategy.step, **self.measure(self._context(runner)))
