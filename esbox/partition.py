"""K-way random partitions of the parameters, regenerable chunk-locally from (seed, step).

Each step draws one shared label *pattern* as long as the layout's longest chunk (its ``span``):
consecutive blocks of K positions, each block a seeded random permutation of the K labels.
Every chunk reads a window of that pattern starting at a block boundary drawn from the chunk's
own seed. A whole block holds every label once, so each chunk's subspace sizes differ by at
most one (the whole layout's by at most the chunk count). A step's partition costs one pattern
of ``span`` labels instead of one label per weight, and a subspace's 0/1 mask over the whole
pattern serves every chunk as a view: one comparison a member instead of one a chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from esbox.noise import allocate, chunk_generator, derive_seed

PARTITION_TAG = 0x5041_5254  # "PART": keeps partition streams apart from noise streams


def label_dtype(num_subspaces: int) -> torch.dtype:
    """The pattern's label type: a byte up to 256 subspaces, int32 beyond."""
    return torch.uint8 if num_subspaces <= 256 else torch.int32


def pattern_length(num_subspaces: int, span: int) -> int:
    """Length of the step's pattern: ``span`` rounded up to whole blocks of K labels."""
    return -(-max(span, 1) // num_subspaces) * num_subspaces


def step_pattern(run_seed: int, step: int, num_subspaces: int, span: int) -> torch.Tensor:
    """The step's label pattern, written twice in a row so that every window is contiguous.

    Drawn on the CPU, so every device (and every replica) reads the same labels; a stable
    sort breaks the rare tied keys by position, the same way on every platform.
    """
    length = pattern_length(num_subspaces, span)
    generator = chunk_generator(derive_seed(PARTITION_TAG, run_seed, step, num_subspaces), "cpu")
    keys = torch.rand(length // num_subspaces, num_subspaces, generator=generator)
    labels = keys.argsort(dim=1, stable=True).view(-1).to(label_dtype(num_subspaces))
    return torch.cat([labels, labels])


def chunk_window(
    run_seed: int, step: int, num_subspaces: int, tensor_index: int, chunk_index: int, span: int
) -> int:
    """Where one chunk's window into the step's pattern starts: a seeded block boundary."""
    blocks = pattern_length(num_subspaces, span) // num_subspaces
    seed = derive_seed(PARTITION_TAG, run_seed, step, num_subspaces, tensor_index, chunk_index)
    block = torch.randint(0, blocks, (1,), generator=chunk_generator(seed, "cpu"))
    return int(block) * num_subspaces


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
    start = chunk_window(run_seed, step, num_subspaces, tensor_index, chunk_index, span)
    return pattern[start : start + numel].to(torch.int64)


class ChunkId(Protocol):
    """What a partition needs to know of a chunk (``esbox.chunks.Chunk`` has it)."""

    tensor_index: int
    chunk_index: int
    numel: int


class LayoutPartition:
    """A chunk layout's partition at one step, drawn once and shared by the step's members and
    its update: the pattern and every chunk's window, and a mask buffer the pattern's length
    (one of each per device). The pattern costs ``2 * span`` bytes (K <= 256) and the buffer
    ``8 * span``, whatever the number of weights."""

    def __init__(self, chunks: Sequence[ChunkId], span: int) -> None:
        self.chunks = chunks
        self.span = span
        self._key: tuple[int, int, int] | None = None
        self._patterns: dict[torch.device, torch.Tensor] = {}
        self._windows: list[int] = []
        self._masks: dict[torch.device, torch.Tensor] = {}
        self._mask_holds: dict[torch.device, tuple[int, int, int, int] | None] = {}

    def draw(
        self, run_seed: int, step: int, num_subspaces: int, device: torch.device
    ) -> tuple[torch.Tensor, list[int]]:
        """The step's pattern on ``device`` and where every chunk's window into it starts."""
        key = (run_seed, step, num_subspaces)
        if self._key != key:
            pattern = step_pattern(run_seed, step, num_subspaces, self.span)
            self._patterns = {torch.device("cpu"): pattern}
            self._windows = [
                chunk_window(
                    run_seed, step, num_subspaces, c.tensor_index, c.chunk_index, self.span
                )
                for c in self.chunks
            ]
            self._mask_holds = {}
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
        *,
        shared: bool = True,
    ) -> torch.Tensor:
        """fp32 0/1 mask of ``subspace`` over chunk ``position`` on ``device``, read-only and
        valid until the next call. ``shared``: a view of the subspace's mask over the whole
        pattern, compared once and read by every chunk (a sweep over one member's chunks);
        otherwise the chunk's window alone is compared (an update, which visits every
        subspace at each chunk)."""
        pattern, windows = self.draw(run_seed, step, num_subspaces, device)
        buffer = self._buffer(device, pattern.numel())
        start, numel = windows[position], self.chunks[position].numel
        if not shared:
            self._mask_holds[device] = None
            return torch.eq(pattern[start : start + numel], subspace, out=buffer[:numel])
        holds = (run_seed, step, num_subspaces, subspace)
        if self._mask_holds.get(device) != holds:
            torch.eq(pattern, subspace, out=buffer[: pattern.numel()])
            self._mask_holds[device] = holds
        return buffer[start : start + numel]

    def _buffer(self, device: torch.device, numel: int) -> torch.Tensor:
        """The device's fp32 mask buffer, at least ``numel`` long (allocated once per size)."""
        if device not in self._masks or self._masks[device].numel() < numel:
            self._masks[device] = allocate(numel, torch.float32, device)
            self._mask_holds[device] = None
        return self._masks[device]
