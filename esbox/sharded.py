"""Spaces over shards of logical tensors: tensor-parallel replicas that draw the same noise.

A tensor-parallel worker holds a block of each logical tensor: rows of a column-parallel weight,
columns of a row-parallel one, all of a replicated norm. :class:`ShardedTensorSpace` lays its
chunks out over the *logical* tensors, as a space over the whole model would, draws each chunk's
noise and subspace mask whole and writes only its block's part. Every shard of a member then
holds exactly what the unsharded space holds there, bit for bit, and a worker draws only the
chunks that meet its blocks. :func:`assemble_state` and :func:`shard_state` move a state dict
between the workers' shards and the logical tensors (a checkpoint is always logical).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from esbox.chunks import Chunk, chunk_layout
from esbox.noise import allocate
from esbox.space import ParameterSpace
from esbox.specs import Perturbation, Term


@dataclass(frozen=True)
class Block:
    """Rows ``[row_start, row_stop)`` x columns ``[col_start, col_stop)`` of a logical tensor
    seen as a ``rows x cols`` matrix (a vector is one column). A shard holds its block
    contiguously, row-major, so the block's elements keep their logical order."""

    rows: int
    cols: int
    row_start: int
    row_stop: int
    col_start: int
    col_stop: int

    def __post_init__(self) -> None:
        if not (0 <= self.row_start < self.row_stop <= self.rows):
            raise ValueError(f"rows [{self.row_start}, {self.row_stop}) outside 0..{self.rows}")
        if not (0 <= self.col_start < self.col_stop <= self.cols):
            raise ValueError(f"columns [{self.col_start}, {self.col_stop}) outside 0..{self.cols}")

    @classmethod
    def whole(cls, shape: Sequence[int]) -> Block:
        """All of a tensor of ``shape`` (a replicated tensor)."""
        rows, cols = matrix_shape(shape)
        return cls(rows, cols, 0, rows, 0, cols)

    @classmethod
    def of_rows(cls, shape: Sequence[int], start: int, stop: int) -> Block:
        """Rows ``[start, stop)`` of the first dimension (a column-parallel shard)."""
        rows, cols = matrix_shape(shape)
        return cls(rows, cols, start, stop, 0, cols)

    @classmethod
    def of_columns(cls, shape: Sequence[int], start: int, stop: int) -> Block:
        """Columns ``[start, stop)`` of a matrix (a row-parallel shard)."""
        rows, cols = matrix_shape(shape)
        return cls(rows, cols, 0, rows, start, stop)

    @property
    def numel(self) -> int:
        return (self.row_stop - self.row_start) * (self.col_stop - self.col_start)

    @property
    def logical_numel(self) -> int:
        return self.rows * self.cols

    @property
    def full_width(self) -> bool:
        return self.col_start == 0 and self.col_stop == self.cols

    def before(self, index: int) -> int:
        """How many of the block's elements have a logical flat index below ``index``."""
        row, col = divmod(index, self.cols)
        width = self.col_stop - self.col_start
        count = (min(max(row, self.row_start), self.row_stop) - self.row_start) * width
        if self.row_start <= row < self.row_stop:
            count += min(max(col, self.col_start), self.col_stop) - self.col_start
        return count

    def local_range(self, start: int, stop: int) -> tuple[int, int]:
        """The shard's slice holding the block's elements of logical ``[start, stop)``."""
        return self.before(start), self.before(stop)

    def take(
        self, values: torch.Tensor, start: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The block's elements of ``values`` (logical ``[start, start + len)``), in order.

        A full-width block gives a view; otherwise the rows are gathered into ``out`` (fresh
        when None): whole rows as one strided copy, a partial first and last row apart.
        """
        stop = start + values.numel()
        low, high = self.local_range(start, stop)
        if self.full_width:
            begin = max(start, self.row_start * self.cols) - start
            return values[begin : begin + high - low]
        if out is None:
            out = torch.empty(high - low, dtype=values.dtype, device=values.device)
        out = out[: high - low]
        cols = self.cols
        whole_start = max(-(-start // cols), self.row_start)  # rows the chunk covers whole
        whole_stop = max(min(stop // cols, self.row_stop), whole_start)
        pieces = []
        head = start // cols  # a first row that the chunk starts inside
        if start % cols and self.row_start <= head < self.row_stop:
            pieces.append(self._row_part(values, start, head))
        if whole_stop > whole_start:
            offset = whole_start * cols - start
            grid = values[offset : offset + (whole_stop - whole_start) * cols]
            pieces.append(grid.view(-1, cols)[:, self.col_start : self.col_stop])
        tail = stop // cols  # a last row that the chunk ends inside (not the first one again)
        if stop % cols and tail >= whole_start and self.row_start <= tail < self.row_stop:
            pieces.append(self._row_part(values, start, tail))
        filled = 0
        for piece in pieces:
            out[filled : filled + piece.numel()].view_as(piece).copy_(piece)
            filled += piece.numel()
        return out

    def _row_part(self, values: torch.Tensor, start: int, row: int) -> torch.Tensor:
        """The block's columns of one row that the chunk only partly covers."""
        lo = max(row * self.cols + self.col_start, start)
        hi = min(row * self.cols + self.col_stop, start + values.numel())
        return values[max(lo - start, 0) : max(hi - start, 0)]

    def of(self, logical: torch.Tensor) -> torch.Tensor:
        """The block of a whole logical tensor (any shape of ``rows * cols`` elements), flat."""
        grid = logical.reshape(self.rows, self.cols)
        return grid[self.row_start : self.row_stop, self.col_start : self.col_stop].reshape(-1)

    def place(self, logical: torch.Tensor, shard: torch.Tensor) -> None:
        """Write a shard's elements into their block of a flat logical tensor."""
        grid = logical.view(self.rows, self.cols)
        block = grid[self.row_start : self.row_stop, self.col_start : self.col_stop]
        block.copy_(shard.reshape(block.shape))

    def to_list(self) -> list[int]:
        return [self.rows, self.cols, self.row_start, self.row_stop, self.col_start, self.col_stop]


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """A tensor's shape as ``(rows, cols)``: the first dimension by the rest (a vector is one
    column)."""
    if not shape:
        return 1, 1
    return int(shape[0]), math.prod(int(s) for s in shape[1:])


class ShardedTensorSpace(ParameterSpace):
    """A ParameterSpace over shards (one block of each logical tensor), edited in place.

    ``shards`` are ``(name, tensor, block)``: the tensor holds the block contiguously. The
    chunk layout, noise streams and subspace masks are those of a space over the whole
    logical tensors with the same options; ``dimension`` counts the logical elements. State
    dicts hold the shards (see :func:`assemble_state`).
    """

    def __init__(self, shards: Sequence[tuple[str, torch.Tensor, Block]], **options: Any) -> None:
        for name, tensor, block in shards:
            if tensor.numel() != block.numel:
                raise ValueError(f"{name}: shard of {tensor.numel()} elements for {block}")
            if not tensor.is_contiguous() or not tensor.is_floating_point():
                raise ValueError(f"tensor {name} must be a contiguous float tensor")
        self.names = [name for name, _, _ in shards]
        self.blocks = [block for _, _, block in shards]
        self._takes: dict[tuple[torch.device, str], list[torch.Tensor]] = {}
        with torch.no_grad():
            super().__init__([tensor for _, tensor, _ in shards], **options)
        self._drawn_of = dict(zip(self.chunks, self._drawn, strict=True))

    def _layout(self, chunk_size: int) -> tuple[list[Chunk], list[Chunk]]:
        """Logical chunks that meet a block, each with the shard's slice it covers."""
        logical = chunk_layout([b.logical_numel for b in self.blocks], chunk_size)
        offsets = [0]  # where each shard starts in this space's own flat layout
        for block in self.blocks:
            offsets.append(offsets[-1] + block.numel)
        local, drawn = [], []
        for chunk in logical:
            index = chunk.tensor_index
            low, high = self.blocks[index].local_range(chunk.start, chunk.stop)
            if high > low:
                local.append(Chunk(index, chunk.chunk_index, low, high, offsets[index] + low))
                drawn.append(chunk)
        return local, drawn

    @property
    def dimension(self) -> int:
        """Number of scalar parameters of the logical tensors."""
        return sum(b.logical_numel for b in self.blocks)

    def _take(self, chunk: Chunk, values: torch.Tensor, slot: str) -> torch.Tensor:
        """The shard's part of a drawn chunk's ``values``: a view, or a gather into one of the
        ``slot``'s two buffers, used in turn (a noise and a mask have their own slots, and the
        value returned last stays valid while the next one is gathered)."""
        block = self.blocks[chunk.tensor_index]
        if block.full_width:
            return block.take(values, self._drawn_of[chunk].start)
        key = (values.device, slot)
        if key not in self._takes:
            largest = max(c.numel for c in self.chunks)
            self._takes[key] = [allocate(largest, values.dtype, values.device) for _ in range(2)]
        buffers = self._takes[key]
        buffers.reverse()
        return block.take(values, self._drawn_of[chunk].start, out=buffers[0])

    def _member_noise(
        self, run_seed: int, step: int, pairs: Sequence[tuple[Chunk, int]]
    ) -> Iterator[torch.Tensor]:
        drawn = [(self._drawn_of[chunk], seed) for chunk, seed in pairs]
        stream = super()._member_noise(run_seed, step, drawn)
        for (chunk, _), eps in zip(pairs, stream, strict=True):
            yield self._take(chunk, eps, "noise")

    def _mask(
        self,
        chunk_position: int,
        run_seed: int,
        step: int,
        spec: Term | Perturbation,
        shared: bool = True,
    ) -> torch.Tensor:
        mask = super()._mask(chunk_position, run_seed, step, spec, shared)
        return self._take(self.chunks[chunk_position], mask, "mask")

    def _explicit_chunks(
        self, values: Sequence[float], what: str
    ) -> Iterator[tuple[Chunk, torch.Tensor]]:
        """``(chunk, the block's part of its logical slice of values)``, float64."""
        if len(values) != self.dimension:
            raise ValueError(f"{what} has {len(values)} values for a space of {self.dimension}")
        vector = torch.tensor(values, dtype=torch.float64)
        for chunk in self.chunks:
            drawn = self._drawn_of[chunk]
            part = vector[drawn.global_start : drawn.global_start + drawn.numel]
            taken = self.blocks[chunk.tensor_index].take(part, drawn.start).clone()
            yield chunk, taken.to(self._flat[chunk.tensor_index].device)


def _tensor_index(key: str) -> int | None:
    """The tensor a per-tensor state key belongs to (``param.3``, ``optimizer.adam_m.3``)."""
    head, _, tail = key.rpartition(".")
    return int(tail) if head and tail.isdigit() else None


def assemble_tensor(
    shards: Sequence[torch.Tensor], blocks: Sequence[Block], name: str
) -> torch.Tensor:
    """One flat logical tensor from its shards (``shards[r]`` holds ``blocks[r]``); raises
    ValueError unless they cover all of it."""
    whole = torch.empty(blocks[0].logical_numel, dtype=shards[0].dtype)
    covered = torch.zeros(whole.numel(), dtype=torch.bool)
    for shard, block in zip(shards, blocks, strict=True):
        block.place(whole, shard)
        block.place(covered, torch.ones(block.numel, dtype=torch.bool))
    if not bool(covered.all()):
        raise ValueError(f"the shards do not cover all of {name}")
    return whole


def assemble_state(
    states: Sequence[Mapping[str, torch.Tensor]], blocks: Sequence[Sequence[Block]]
) -> dict[str, torch.Tensor]:
    """One logical state dict from every shard's (``blocks[r][i]``: shard ``r``'s block of
    tensor ``i``). Per-tensor entries are assembled flat; the others are shard 0's."""
    out: dict[str, torch.Tensor] = {}
    for key, first in states[0].items():
        index = _tensor_index(key)
        if index is None:
            out[key] = first
        else:
            shards = [state[key] for state in states]
            out[key] = assemble_tensor(shards, [b[index] for b in blocks], key)
    return out


def shard_state(
    state: Mapping[str, torch.Tensor], blocks: Sequence[Block]
) -> dict[str, torch.Tensor]:
    """A shard's state dict from a logical one (the inverse of :func:`assemble_state`)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        index = _tensor_index(key)
        out[key] = value if index is None else blocks[index].of(value).clone()
    return out
