"""K-way random partitions of the parameters, regenerable chunk-locally from (seed, step).

Within a chunk the labels are a seeded random permutation of the chunk's positions offset by
the chunk's global start, modulo K. Offsetting by the global start makes the union over all
chunks a permutation of ``0..d-1`` relabelled mod K, so subspace sizes differ by at most one.
"""

from __future__ import annotations

import functools

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


def label_bits(num_subspaces: int) -> int:
    """Bits that store one label in the packed cache: 1, 2, 4 or 8 (32 beyond 256 subspaces)."""
    for bits in (1, 2, 4, 8):
        if num_subspaces <= 1 << bits:
            return bits
    return 32


def pack_labels(labels: torch.Tensor, num_subspaces: int) -> torch.Tensor:
    """A chunk's labels packed ``8 // bits`` to a byte (K = 4: a quarter of a byte per weight).

    Label ``j`` of each group of ``8 // bits`` sits in bits ``[bits * j, bits * (j + 1))``.
    """
    bits = label_bits(num_subspaces)
    if bits == 32:
        return labels.to(torch.int32)
    per_byte = 8 // bits
    groups = -(-labels.numel() // per_byte)
    padded = torch.zeros(groups * per_byte, dtype=torch.uint8, device=labels.device)
    padded[: labels.numel()] = labels
    padded = padded.view(groups, per_byte)
    packed = padded[:, 0].clone()
    for j in range(1, per_byte):
        packed |= padded[:, j] << (bits * j)
    return packed


@functools.lru_cache(maxsize=256)
def _mask_table(bits: int, subspace: int, device: torch.device) -> torch.Tensor:
    """For every byte value, the fp32 0/1 membership of each label packed in it."""
    shifts = torch.arange(0, 8, bits, device=device)
    values = torch.arange(256, device=device).unsqueeze(1)
    return (((values >> shifts) & ((1 << bits) - 1)) == subspace).to(torch.float32)


def subspace_mask(
    packed: torch.Tensor,
    numel: int,
    num_subspaces: int,
    subspace: int,
    out: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fp32 0/1 mask of ``subspace`` over a chunk's packed labels (one table lookup).

    Optional reused buffers avoid allocations (and their page faults): ``out`` (fp32, at
    least ``numel`` rounded up to a whole byte of labels) and ``index`` (int32, at least as
    long as ``packed``). A float mask, not a bool one: multiplying by it is faster on CPU.
    """
    bits = label_bits(num_subspaces)
    if bits == 32:
        return (packed == subspace).to(torch.float32)
    table = _mask_table(bits, subspace, packed.device)
    rows = packed.numel()
    if out is not None:
        out = out[: rows * table.shape[1]].view(rows, table.shape[1])
    rows_index = index[:rows].copy_(packed) if index is not None else packed.to(torch.int32)
    return torch.index_select(table, 0, rows_index, out=out).view(-1)[:numel]
