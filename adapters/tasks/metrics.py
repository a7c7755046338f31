"""Evaluation metrics of a model on a task split: accuracy, mean reward, unbiased pass@k.

pass@k follows Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code"): with ``n`` samples of which ``c`` are correct, the unbiased estimate is
``1 - C(n-c, k) / C(n, k)``, computed in the stable product form
``1 - prod_{i=n-c+1}^{n} (1 - k/i)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .base import with_context


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over problems; ``correct[j]`` holds the per-sample results of problem j."""
    if not correct:
        raise ValueError("no problems")
    return math.fsum(pass_at_k(len(s), sum(bool(x) for x in s), k) for s in correct) / len(correct)


def accuracy(correct: Iterable[bool | float], threshold: float = 1.0) -> float:
    """Fraction of items counted correct (a reward counts when it is >= ``threshold``)."""
    values = [float(x) >= threshold for x in correct]
    if not values:
        raise ValueError("no items")
    return sum(values) / len(values)


def mean_reward(rewards: Iterable[float]) -> float:
    """Plain mean of the rewards (NaN stays NaN: a broken reward should be visible)."""
    values = [float(r) for r in rewards]
    if not values:
        raise ValueError("no rewards")
    return math.fsum(values) / len(values)


def summarize(
    correct: Sequence[Sequence[bool]],
    rewards: Sequence[Sequence[float]] | None = None,
    *,
    ks: Iterable[int] = (1,),
) -> dict[str, float]:
    """Metrics for ``correct[problem][sample]`` (and the matching ``rewards``).

    ``accuracy`` uses the first sample of each problem (the greedy one when
    sampling is off); ``mean_reward`` averages all samples; ``pass@k`` is
    reported for each ``k`` up to the smallest number of samples per problem.
    """
    if not correct or any(len(s) == 0 for s in correct):
        raise ValueError("every problem needs at least one sample")
    out = {"accuracy": accuracy(bool(s[0]) for s in correct)}
    if rewards is not None:
        out["mean_reward"] = mean_reward(r for s in rewards for r in s)
    n_min = min(len(s) for s in correct)
    for k in ks:
        if 1 <= k <= n_min:
            out[f"pass@{k}"] = mean_pass_at_k(correct, k)
    return out


def pass_ks(num_samples: int) -> list[int]:
    """The k of the pass@k an evaluation reports: 1, 2, 4, ... up to ``num_samples``, and it."""
    return sorted({1, num_samples} | {2**i for i in range(num_samples.bit_length())})


def evaluate(
    task: Any,
    backend: Any,
    *,
    split: str = "heldout",
    limit: int | None = None,
    num_samples: int = 1,
    greedy: bool | None = None,
    seed: int | None = 0,
    max_new_tokens: int | None = None,
    ks: Iterable[int] | None = None,
    batch_size: int | None = 64,
    progress: Callable[[int], None] | None = None,
    context: str | None = None,
) -> dict[str, float]:
    """Score the model behind ``backend`` on a task split: accuracy, mean reward, pass@k.

    Greedy when ``num_samples == 1`` unless told otherwise; with several
    samples, ``pass@k`` is reported for k = 1, 2, 4, ... up to ``num_samples``.
    Prompts go to the backend ``batch_size`` at a time; ``progress`` is called with the
    number of questions of each batch once it is generated (e.g. a progress bar's update);
    ``context`` (an ESOpt context) comes before every prompt.
    """
    examples = task.split(split)[:limit]
    if ks is None:
        ks = pass_ks(num_samples)
    correct, rewards = score_examples(
        task, backend, examples, num_samples=num_samples, greedy=greedy, seed=seed,
        max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress, context=context,
    )  # fmt: skip
    return {**summarize(correct, rewards, ks=ks), "n": float(len(examples))}


def score_examples(
    task: Any,
    backend: Any,
    examples: Sequence[Any],
    *,
    num_samples: int = 1,
    greedy: bool | None = None,
    seed: int | None = 0,
    max_new_tokens: int | None = None,
    batch_size: int | None = 64,
    progress: Callable[[int], None] | None = None,
    context: str | None = None,
) -> tuple[list[list[bool]], list[list[float]]]:
    """``(correct, rewards)[question][sample]`` of ``num_samples`` completions a question
    (greedy when 1 unless told otherwise), read after ``context`` when one is given, so that
    models can be compared question by question."""

    if greedy is None:
        greedy = num_samples == 1
    step = batch_size or len(examples)
    completions: list[str] = []
    for i in range(0, len(examples), step):
        chunk = examples[i : i + step]
        completions += backend.generate(
            [with_context(e.prompt, context) for e in chunk],
            prefills=[e.prefill for e in chunk],
            max_new_tokens=max_new_tokens or task.max_new_tokens,
            greedy=greedy,
            seed=None if seed is None else seed + i,
            stop=list(task.stop) or None,
            num_samples=num_samples,
        )
        if progress is not None:
            progress(len(chunk))
    correct, rewards = [], []
    for j, ex in enumerate(examples):
        outs = completions[j * num_samples : (j + 1) * num_samples]
        correct.append([task.is_correct(c, ex) for c in outs])
        rewards.append([task.reward(c, ex) for c in outs])
    return correct, rewards
