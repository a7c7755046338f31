"""Evaluation metrics for verifiable-reward tasks: accuracy, mean reward, unbiased pass@k.

pass@k follows Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code"): with ``n`` samples of which ``c`` are correct, the unbiased estimate is
``1 - C(n-c, k) / C(n, k)``, computed in the stable product form
``1 - prod_{i=n-c+1}^{n} (1 - k/i)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


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
    rewards: Sequence[Sequence[float]],
    *,
    ks: Iterable[int] = (1,),
    threshold: float = 1.0,
) -> dict[str, float]:
    """Metrics for ``rewards[problem][sample]``.

    Returns ``accuracy`` (first sample per problem: the greedy one when
    sampling is off), ``mean_reward`` (all samples) and ``pass@k`` for each
    ``k`` not larger than the smallest number of samples per problem.
    """
    if not rewards or any(len(s) == 0 for s in rewards):
        raise ValueError("every problem needs at least one sample")
    correct = [[float(r) >= threshold for r in s] for s in rewards]
    out = {
        "accuracy": accuracy(s[0] for s in correct),
        "mean_reward": mean_reward(r for s in rewards for r in s),
    }
    n_min = min(len(s) for s in rewards)
    for k in ks:
        if 1 <= k <= n_min:
            out[f"pass@{k}"] = mean_pass_at_k(correct, k)
    return out
