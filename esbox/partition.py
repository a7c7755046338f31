"""K-way random partitions of the parameters, regenerable chunk-locally from (seed, step).

Each step draws one shared label *pattern* as long as the layout's longest chunk (its ``span``):
consecutive blocks of K positions, each block a seeded random permutation of the K labels.
Every chunk reads a window of that pattern, starting at a block boundary drawn from the
chunk's own seed, with its labels rotated by a seeded amount. A whole block holds every label
once, so each chunk's subspace sizes differ by at most one (the whole layout's by at most the
chunk count), and a step's partition costs one pattern of ``span`` labels instead of one label
per weight: a byte a label (K <= 256), whatever the model's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Window:
    """Where a chunk reads the step's pattern, and by how much its labels are rotated."""

    start: int
    rotation: int


def chunk_window(
    run_seed: int, step: int, num_subspaces: int, tensor_index: int, chunk_index: int, span: int
) -> Window:
    """The seeded window of one chunk at one step: a block boundary and a rotation."""
    blocks = pattern_length(num_subspaces, span) // num_subspaces
    seed = derive_seed(PARTITION_TAG, run_seed, step, num_subspaces, tensor_index, chunk_index)
    draw = torch.randint(0, blocks * num_subspaces, (1,), generator=chunk_generator(seed, "cpu"))
    block, rotation = divmod(int(draw), num_subspaces)
    return Window(block * num_subspaces, rotation)


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


class ChunkId(Protocol):
    """What a partition needs to know of a chunk (``esbox.space.Chunk`` has it)."""

    tensor_index: int
    chunk_index: int
    numel: int


class LayoutPartition:
    """A chunk layout's partition at one step, drawn once and shared by the step's members and
    its update: the pattern (one copy per device), every chunk's window, and a reused mask
    buffer. The pattern costs ``2 * span`` bytes (K <= 256), whatever the number of weights."""

    def __init__(self, chunks: Sequence[ChunkId], span: int) -> None:
        self.chunks = chunks
        self.span = span
        self._key: tuple[int, int, int] | None = None
        self._patterns: dict[torch.device, torch.Tensor] = {}
        self._windows: list[Window] = []
        self._masks: dict[torch.device, torch.Tensor] = {}

    def draw(
        self, run_seed: int, step: int, num_subspaces: int, device: torch.device
    ) -> tuple[torch.Tensor, list[Window]]:
        """The step's pattern on ``device`` and every chunk's window into it."""
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
        buffer, valid until the next call): one comparison of the chunk's window."""
        pattern, windows = self.draw(run_seed, step, num_subspaces, device)
        if device not in self._masks:
            self._masks[device] = allocate(self.span, torch.float32, device)
        window = windows[position]
        numel = self.chunks[position].numel
        unrotated = (subspace - window.rotation) % num_subspaces  # the label the pattern holds
        labels = pattern[window.start : window.start + numel]
        return torch.eq(labels, unrotated, out=self._masks[device][:numel])
