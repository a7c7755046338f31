"""Seed-replayed chunk noise: regenerated on demand, never stored, never N x d."""

from __future__ import annotations

import hashlib
import struct
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

NOISE_DTYPE = torch.float32
NOISE_MODES = ("generator", "table")
DEFAULT_TABLE_SIZE = 1 << 25  # 128 MiB of fp32 noise
TABLE_TAG = 0x5441_424C  # "TABL": keeps the table's stream apart from chunk streams


def derive_seed(*parts: int) -> int:
    """A 63-bit generator seed from integer parts, stable across platforms and runs.

    Hashing the full tuple (not adding offsets) keeps streams for different tensors and
    chunks unrelated: a shared seed across tensors correlates their noise.
    """
    data = struct.pack(f"<{len(parts)}q", *(int(p) & 0x7FFFFFFFFFFFFFFF for p in parts))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def allocate(numel: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised buffer that stays writable outside ``torch.inference_mode`` even when
    first allocated inside it (spaces keep their buffers across steps)."""
    with torch.inference_mode(False):
        return torch.empty(numel, dtype=dtype, device=device)


def chunk_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A fresh generator on ``device`` seeded with ``seed``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def fill_noise(out: torch.Tensor, seed: int) -> torch.Tensor:
    """Fill the fp32 buffer ``out`` with standard normal noise from ``seed`` (no allocation)."""
    return out.normal_(generator=chunk_generator(seed, out.device))


def chunk_noise(
    run_seed: int,
    step: int,
    member_seed: int,
    tensor_index: int,
    chunk_index: int,
    numel: int,
    device: torch.device | str = "cpu",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fp32 noise of one chunk of one member, regenerated from its seeds."""
    if out is None:
        out = torch.empty(numel, dtype=NOISE_DTYPE, device=device)
    seed = derive_seed(run_seed, step, member_seed, tensor_index, chunk_index)
    return fill_noise(out[:numel], seed)


class NoiseTable:
    """A shared table of N(0, 1) fp32 noise; a chunk's noise is a window at a seeded offset.

    The alternative to one Gaussian draw per chunk (Salimans et al. 2017 shared such a table
    between workers): realising a chunk is a copy, several times cheaper than a CPU draw.
    Windows of different members overlap at different offsets, so their noise is uncorrelated
    in expectation, but it is not independent: this is an explicit speed/quality trade-off.
    """

    def __init__(self, size: int = DEFAULT_TABLE_SIZE, seed: int = 0) -> None:
        if size < 1:
            raise ValueError(f"the noise table needs at least one entry, got {size}")
        self.size, self.seed = size, seed
        self._tables: dict[torch.device, torch.Tensor] = {}

    def window(self, seed: int, numel: int, device: torch.device) -> torch.Tensor:
        """The ``numel`` entries at the offset that ``seed`` selects (a read-only view)."""
        if numel > self.size:
            raise ValueError(
                f"a chunk of {numel} elements does not fit a noise table of "
                f"{self.size}; raise the table size or lower chunk_size"
            )
        if device not in self._tables:
            table = allocate(self.size, NOISE_DTYPE, device)
            self._tables[device] = fill_noise(table, derive_seed(TABLE_TAG, self.seed))
        offset = seed % (self.size - numel + 1)
        return self._tables[device][offset : offset + numel]


def _one_torch_thread() -> None:
    """Keep a worker's own ATen ops serial: a long-lived thread that runs parallel ops keeps its
    own OpenMP team, which slowed the main thread's forward passes by 40% on 2 cores."""
    torch.set_num_threads(1)


class NoiseFiller:
    """Fills fp32 noise buffers from seeds, up to ``threads`` chunks ahead of the consumer.

    With a ``table``, noise is copied from table windows instead (always inline). Otherwise
    every chunk keeps its own generator, so the noise is identical for any thread count; only
    the wall time changes (CPU generators are serial, so chunks are drawn in parallel). Memory
    is ``threads + 1`` buffers of ``capacity`` elements per device, independent of N.
    """

    MIN_PARALLEL = 1 << 16  # smaller chunks are drawn inline: a thread hop costs more

    def __init__(self, capacity: int, threads: int = 1, table: NoiseTable | None = None) -> None:
        self.capacity = capacity
        self.threads = max(1, int(threads))
        self.table = table
        self._rings: dict[torch.device, list[torch.Tensor]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def _ring(self, device: torch.device) -> list[torch.Tensor]:
        if device not in self._rings:
            size = self.threads + 1 if device.type == "cpu" else 1
            self._rings[device] = [
                allocate(self.capacity, NOISE_DTYPE, device) for _ in range(size)
            ]
        return self._rings[device]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.threads, thread_name_prefix="esbox-noise", initializer=_one_torch_thread
            )
        return self._pool

    def stream(self, requests: Sequence[tuple[int, int, torch.device]]) -> Iterator[torch.Tensor]:
        """Noise for each ``(numel, seed, device)`` request, in order: read-only.

        A yielded tensor is a reused buffer, valid until the next one is requested, or a view
        of the noise table; either way the caller must not modify it.
        """
        devices = {device for _, _, device in requests}
        parallel = (
            self.table is None
            and self.threads > 1
            and devices == {torch.device("cpu")}
            and max((n for n, _, _ in requests), default=0) >= self.MIN_PARALLEL
        )
        if not parallel:
            for numel, seed, device in requests:
                if self.table is not None:
                    yield self.table.window(seed, numel, device)
                else:
                    yield fill_noise(self._ring(device)[0][:numel], seed)
            return
        ring = self._ring(torch.device("cpu"))
        pool = self._executor()
        pending: deque = deque()

        def submit(j: int) -> None:
            numel, seed, _ = requests[j]
            pending.append(pool.submit(fill_noise, ring[j % len(ring)][:numel], seed))

        for j in range(min(self.threads, len(requests))):
            submit(j)
        try:
            for i in range(len(requests)):
                eps = pending.popleft().result()
                if i + self.threads < len(requests):
                    submit(i + self.threads)
                yield eps
        finally:  # an abandoned stream must not leave writers on the shared buffers
            for future in pending:
                future.exception()
