"""Low-rank (EGGROLL-style) noise for weight matrices, regenerated from seeds: the model-free maths.

Member ``seed``'s noise on an ``m x n`` matrix is ``E = A B^T / sqrt(r)`` with ``A`` (m x r) and
``B`` (n x r) standard normal, drawn from one generator seeded by ``(run seed, step, member
seed, tensor index)``. Every entry of ``E`` has unit variance, as full-rank noise does, so
sigma means the same in both modes. Only the factors ever exist, ``(m + n) r`` floats a member
(Sarkar et al. 2025, "Evolution Strategies at the Hyperscale"): ``x (W + s E)^T = x W^T +
(s / sqrt(r)) (x B) A^T`` lets members share one batched forward, and an update
``sum_j c_j A_j B_j^T / sqrt(r)`` is the product of the stacked factors, formed a row block at
a time. Vectors (norm scales, biases) have no low-rank form: low-rank mode leaves them frozen.

CoPES's subspaces in low-rank mode are subsets of the matrices (``matrix_labels``): masking
entries of ``A B^T`` would destroy the rank, so a member perturbs whole matrices of its subset.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from esbox.config import option
from esbox.errors import ConfigError
from esbox.noise import NOISE_DTYPE, chunk_generator, derive_seed

LOWRANK_TAG = 0x4C4F_5752  # "LOWR": keeps factor streams apart from chunk streams
MATRIX_PARTITION_TAG = 0x4D50_4152  # "MPAR": the per-step subsets of matrices
PERTURBATIONS = ("full", "lowrank")


@dataclass
class LowRankOptions:
    """Strategy options choosing full-rank or low-rank noise (a mixin of a strategy's Options)."""

    perturbation: str = option(
        "full",
        "full: Gaussian noise on every weight; lowrank: A B^T / sqrt(rank) on every weight "
        "matrix (one batched forward per step; vectors frozen)",
        choices=PERTURBATIONS,
    )
    rank: int = option(4, "r of the low-rank noise (with perturbation: lowrank)", minimum=1)


def spec_rank(options: Any) -> int:
    """The rank a strategy's specs carry: ``options.rank`` in low-rank mode, else 0 (full)."""
    if getattr(options, "perturbation", "full") != "lowrank":
        return 0
    return int(options.rank)


def factors(
    run_seed: int,
    step: int,
    member_seed: int,
    tensor_index: int,
    shape: tuple[int, int],
    rank: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 factors ``(A, B)`` of one member's noise on one ``(m, n)`` matrix: A then B drawn
    from one generator on ``device`` (the same spec gives the same factors on a device type)."""
    rows, cols = shape
    generator = chunk_generator(
        derive_seed(LOWRANK_TAG, run_seed, step, member_seed, tensor_index), device
    )
    a = torch.empty(rows, rank, dtype=NOISE_DTYPE, device=device).normal_(generator=generator)
    b = torch.empty(cols, rank, dtype=NOISE_DTYPE, device=device).normal_(generator=generator)
    return a, b


def stacked_factors(
    run_seed: int,
    step: int,
    weighted: Sequence[tuple[int, float]],
    tensor_index: int,
    shape: tuple[int, int],
    rank: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A_cat, B_cat)`` with ``A_cat @ B_cat.T == sum_j c_j A_j B_j^T / sqrt(r)`` over the
    ``(member seed, c_j)`` pairs: ``(m + n) r`` floats a pair, never ``m x n`` per pair."""
    scale = 1.0 / math.sqrt(rank)
    a_parts, b_parts = [], []
    for seed, coefficient in weighted:
        a, b = factors(run_seed, step, seed, tensor_index, shape, rank, device)
        a_parts.append(a)
        b_parts.append(b.mul_(coefficient * scale))
    return torch.cat(a_parts, dim=1), torch.cat(b_parts, dim=1)


def row_blocks(rows: int, cols: int, budget: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` row ranges of at most ``budget`` elements (at least one row each)."""
    step = max(1, budget // max(cols, 1))
    for start in range(0, rows, step):
        yield start, min(start + step, rows)


def matrix_labels(run_seed: int, step: int, num_subspaces: int, count: int) -> list[int]:
    """The subspace (0..K-1) of each of ``count`` matrices at one step: a seeded permutation
    dealt round-robin, so subsets hold ``count // K`` or one more matrices (by count, not by
    size). Drawn on the CPU, the same on every replica; new every step."""
    generator = chunk_generator(
        derive_seed(MATRIX_PARTITION_TAG, run_seed, step, num_subspaces), "cpu"
    )
    order = torch.randperm(count, generator=generator).tolist()
    labels = [0] * count
    for position, matrix in enumerate(order):
        labels[matrix] = position % num_subspaces
    return labels


def refuse_low_rank(rank: int) -> None:
    """ConfigError for a low-rank spec on a space that does not know its weight matrices."""
    if rank:
        raise ConfigError(
            "strategy option perturbation 'lowrank' needs weight matrices (a model space, "
            "problem kind llm); this space is a vector: use perturbation 'full'"
        )
