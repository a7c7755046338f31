"""Reward shaping: turn raw rewards into the weights of the gradient estimate.

Rule for bad rewards: every non-finite reward (NaN, +inf, -inf) counts as a failure and is
replaced by the worst finite reward of the population before shaping; if no reward is finite
the shaped rewards are all zero (a zero update). Degenerate populations (all rewards equal)
also shape to zeros, never NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SHAPINGS = ("centered_ranks", "zscore", "raw", "utilities")


def sanitize(rewards: Sequence[float] | np.ndarray) -> tuple[np.ndarray, int]:
    """Replace non-finite rewards by the worst finite one; returns (rewards, how many)."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1).copy()
    bad = ~np.isfinite(r)
    n_bad = int(bad.sum())
    if n_bad:
        r[bad] = r[~bad].min() if n_bad < r.size else 0.0
    return r, n_bad


def centered_ranks(rewards: np.ndarray) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5] (ties share their average rank): invariant to monotone maps."""
    r = np.asarray(rewards, dtype=np.float64)
    n = r.size
    if n < 2:
        return np.zeros(n)
    order = np.argsort(r, kind="stable")
    sorted_r = r[order]
    ranks = np.empty(n)
    starts = np.flatnonzero(np.r_[True, sorted_r[1:] != sorted_r[:-1]])
    ends = np.r_[starts[1:], n]
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = (start + end - 1) / 2.0
    return ranks / (n - 1) - 0.5


def zscore(rewards: np.ndarray) -> np.ndarray:
    """(r - mean) / std over the population; all-equal rewards give zeros."""
    r = np.asarray(rewards, dtype=np.float64)
    std = r.std()
    if r.size < 2 or std == 0.0 or not np.isfinite(std):
        return np.zeros(r.size)
    return (r - r.mean()) / std


def raw(rewards: np.ndarray) -> np.ndarray:
    """The rewards unchanged, except that all-equal rewards give zeros (a zero update)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < 2 or np.all(r == r[0]):
        return np.zeros(r.size)
    return r.copy()


def utilities(rewards: np.ndarray) -> np.ndarray:
    """NES fitness shaping (Wierstra et al. 2014): the k-th best of n gets
    max(0, ln(n/2 + 1) - ln k) / sum - 1/n, so only the better half pulls and the weights sum
    to zero. Tied rewards share the mean of their weights."""
    r = np.asarray(rewards, dtype=np.float64)
    n = r.size
    if n < 2 or np.all(r == r[0]):
        return np.zeros(n)
    raw_weights = np.maximum(0.0, np.log(n / 2 + 1) - np.log(np.arange(1, n + 1)))
    weights = raw_weights / raw_weights.sum() - 1.0 / n  # weights[0]: the best member's
    ranks = (centered_ranks(r) + 0.5) * (n - 1)  # 0 = worst, n - 1 = best; ties averaged
    out = np.empty(n)
    for rank in np.unique(ranks):
        tied = ranks == rank
        count = int(tied.sum())
        best_position = int(np.rint(n - 1 - rank - (count - 1) / 2))  # 0-based, best first
        out[tied] = weights[best_position : best_position + count].mean()
    return out


def shape(rewards: np.ndarray, method: str, groups: np.ndarray | None = None) -> np.ndarray:
    """Shape rewards jointly, or separately within each group label when ``groups`` is given."""
    if method not in SHAPINGS:
        raise ValueError(f"unknown shaping '{method}' (allowed: {', '.join(SHAPINGS)})")
    fn = {"centered_ranks": centered_ranks, "zscore": zscore, "raw": raw, "utilities": utilities}[
        method
    ]
    r = np.asarray(rewards, dtype=np.float64)
    if groups is None:
        return np.asarray(fn(r), dtype=np.float64)
    out = np.empty_like(r)
    for g in np.unique(groups):
        idx = groups == g
        out[idx] = fn(r[idx])
    return out
