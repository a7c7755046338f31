"""The chunk layout of a space: the fixed slices that noise is regenerated in, one at a time.

Replay is defined on this layout: the same spec gives the same noise for the same layout and
device type, and peak extra memory is one chunk (DESIGN §3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """A contiguous slice ``[start, stop)`` of flat tensor ``tensor_index``."""

    tensor_index: int
    chunk_index: int
    start: int
    stop: int
    global_start: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


def chunk_layout(numels: Sequence[int], chunk_size: int) -> list[Chunk]:
    """Split each tensor into chunks of at most ``chunk_size`` elements (never across tensors)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    chunks, offset = [], 0
    for t, numel in enumerate(numels):
        for c, start in enumerate(range(0, numel, chunk_size)):
            stop = min(start + chunk_size, numel)
            chunks.append(Chunk(t, c, start, stop, offset + start))
        offset += numel
    return chunks
