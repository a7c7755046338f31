"""K-way random partitions of the parameters, regenerable chunk-locally from (seed, step).

Within a chunk the labels are a seeded random permutation of the chunk's positions offset by
the chunk's global start, modulo K. Offsetting by the global start makes the union over all
chunks a permutation of ``0..d-1`` relabelled mod K, so subspace sizes differ by at most one.
"""

from __future__ import annotations

import torch

from esbox.noise import chunk_generator, derive_seed

PARTITION_TAG = 0x5041_5254  # "PART": keeps partition streams apart from noise streams


def chunk_labels(
    run_seed: int,
    step: int,
    num_subspaces: int,
    tensor_index: int,
    chunk_index: int,
    numel: int,
    global_start: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Subspace label (0..K-1) of every position of one chunk at one step."""
    seed = derive_seed(PARTITION_TAG, run_seed, step, num_subspaces, tensor_index, chunk_index)
    dtype = torch.int32 if numel + num_subspaces < 2**31 else torch.int64
    perm = torch.randperm(
        numel, generator=chunk_generator(seed, device), device=device, dtype=dtype
    )
    # (perm + global_start) % K, in place and without overflow: reduce the offset first
    return perm.add_(global_start % num_subspaces).remainder_(num_subspaces)
