"""K-way random partitions of the parameters, regenerable chunk-locally from (seed, step).

Each step draws one shared label *pattern* as long as the layout's longest chunk (its ``span``):
consecutive blocks of K positions, each block a seeded random permutation of the K labels.
Every chunk reads a window of that pattern, starting at a block boundary drawn from the
chunk's own seed, with its labels rotated by a seeded amount. A whole block holds every label
once, so each chunk's subspace sizes differ by at most one (the whole layout's by at most the
chunk count), and a step's partition costs one pattern of ``span`` labels instead of one label
per weight: 2 bits x span at K = 4, whatever the model's size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from esbox.noise import allocate, chunk_generator, derive_seed

PARTITION_TAG = 0x5041_5254  # "PART": keeps partition streams apart from noise streams


def label_bits(num_subspaces: int) -> int:
    """Bits that store one packed label: 1, 2, 4 or 8 (32 beyond 256 subspaces)."""
    for bits in (1, 2, 4, 8):
        if num_subspaces <= 1 << bits:
            return bits
    return 32


def _labels_per_byte(num_subspaces: int) -> int:
    bits = label_bits(num_subspaces)
    return 1 if bits == 32 else 8 // bits


def window_unit(num_subspaces: int) -> int:
    """Windows start at multiples of this: a whole label block and a whole packed byte."""
    return math.lcm(num_subspaces, _labels_per_byte(num_subspaces))


def pattern_length(num_subspaces: int, span: int) -> int:
    """Length of the step's pattern: ``span`` rounded up to whole window units."""
    unit = window_unit(num_subspaces)
    return -(-max(span, 1) // unit) * unit


def step_pattern(run_seed: int, step: int, num_subspaces: int, span: int) -> torch.Tensor:
    """The step's label pattern, written twice in a row so that every window is contiguous.

    Drawn on the CPU, so every device (and every replica) reads the same labels; a stable
    sort breaks the rare tied keys by position, the same way on every platform.
    """
    length = pattern_length(num_subspaces, span)
    generator = chunk_generator(derive_seed(PARTITION_TAG, run_seed, step, num_subspaces), "cpu")
    keys = torch.rand(length // num_subspaces, num_subspaces, generator=generator)
    labels = (
        keys.argsort(dim=1, stable=True)
        .view(-1)
        .to(torch.uint8 if num_subspaces <= 256 else torch.int32)
    )
    return torch.cat([labels, labels])


@dataclass(frozen=True)
class Window:
    """Where a chunk reads the step's pattern, and by how much its labels are rotated."""

    start: int
    rotation: int


def chunk_window(
    run_seed: int, step: int, num_subspaces: int, tensor_index: int, chunk_index: int, span: int
) -> Window:
    """The seeded window of one chunk at one step."""
    unit = window_unit(num_subspaces)
    starts = pattern_length(num_subspaces, span) // unit
    seed = derive_seed(PARTITION_TAG, run_seed, step, num_subspaces, tensor_index, chunk_index)
    draw = torch.randint(0, starts * num_subspaces, (1,), generator=chunk_generator(seed, "cpu"))
    start, rotation = divmod(int(draw), num_subspaces)
    return Window(start * unit, rotation)


def chunk_labels(
    run_seed: int,
    step: int,
    num_subspaces: int,
    tensor_index: int,
    chunk_index: int,
    numel: int,
    span: int,
) -> torch.Tensor:
    """Subspace label (0..K-1) of every position of one chunk at one step (int64, CPU)."""
    if numel > span:
        raise ValueError(f"a chunk of {numel} elements exceeds the layout's span {span}")
    pattern = step_pattern(run_seed, step, num_subspaces, span)
    window = chunk_window(run_seed, step, num_subspaces, tensor_index, chunk_index, span)
    labels = pattern[window.start : window.start + numel].to(torch.int64)
    return labels.add_(window.rotation).remainder_(num_subspaces)


def pack_labels(labels: torch.Tensor, num_subspaces: int) -> torch.Tensor:
    """Labels packed ``8 // bits`` to a byte (K = 4: a quarter of a byte each).

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
    """The fp32 0/1 mask of ``subspace`` over ``numel`` packed labels (one table lookup).

    Optional reused buffers avoid allocations (and their page faults): ``out`` (fp32, at
    least ``numel`` rounded up to a whole byte of labels) and ``index`` (int32, at least as
    long as ``packed``). A float mask, not a bool one: multiplying by it is faster on CPU.
    """
    bits = label_bits(num_subspaces)
    if bits == 32:
        return (packed[:numel] == subspace).to(torch.float32)
    table = _mask_table(bits, subspace, packed.device)
    rows = -(-numel // table.shape[1])
    packed = packed[:rows]
    if out is not None:
        out = out[: rows * table.shape[1]].view(rows, table.shape[1])
    rows_index = index[:rows].copy_(packed) if index is not None else packed.to(torch.int32)
    return torch.index_select(table, 0, rows_index, out=out).view(-1)[:numel]


class ChunkId(Protocol):
    """What a partition needs to know of a chunk (``esbox.space.Chunk`` has it)."""

    tensor_index: int
    chunk_index: int
    numel: int


class LayoutPartition:
    """A chunk layout's partition at one step, drawn once and shared by the step's members and
    its update: the packed pattern (one copy per device), every chunk's window, and reused
    mask buffers. It costs ``2 * span * bits / 8`` bytes, whatever the number of weights."""

    def __init__(self, chunks: Sequence[ChunkId], span: int) -> None:
        self.chunks = chunks
        self.span = span
        self._key: tuple[int, int, int] | None = None
        self._patterns: dict[torch.device, torch.Tensor] = {}
        self._windows: list[Window] = []
        self._buffers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def draw(
        self, run_seed: int, step: int, num_subspaces: int, device: torch.device
    ) -> tuple[torch.Tensor, list[Window]]:
        """The step's packed pattern on ``device`` and every chunk's window into it."""
        key = (run_seed, step, num_subspaces)
        if self._key != key:
            pattern = step_pattern(run_seed, step, num_subspaces, self.span)
            self._patterns = {torch.device("cpu"): pack_labels(pattern, num_subspaces)}
            self._windows = [
                chunk_window(
                    run_seed, step, num_subspaces, c.tensor_index, c.chunk_index, self.span
                )
                for c in self.chunks
            ]
            self._key = key
        if device not in self._patterns:
            self._patterns[device] = self._patterns[torch.device("cpu")].to(device)
        return self._patterns[device], self._windows

    def mask(
        self,
        position: int,
        device: torch.device,
        run_seed: int,
        step: int,
        num_subspaces: int,
        subspace: int,
    ) -> torch.Tensor:
        """fp32 0/1 mask of ``subspace`` over chunk ``position`` on ``device`` (a reused
        buffer, valid until the next call)."""
        pattern, windows = self.draw(run_seed, step, num_subspaces, device)
        if device not in self._buffers:
            self._buffers[device] = (
                allocate(self.span + 8, torch.float32, device),
                allocate(self.span, torch.int32, device),
            )
        out, index = self._buffers[device]
        window = windows[position]
        first_byte = window.start // _labels_per_byte(num_subspaces)
        unrotated = (subspace - window.rotation) % num_subspaces  # the label the pattern holds
        numel = self.chunks[position].numel
        return subspace_mask(pattern[first_byte:], numel, num_subspaces, unrotated, out, index)
