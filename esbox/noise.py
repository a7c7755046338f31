"""Seed-replayed chunk noise: regenerated on demand, never stored, never N x d."""

from __future__ import annotations

import hashlib
import struct

import torch

NOISE_DTYPE = torch.float32


def derive_seed(*parts: int) -> int:
    """A 63-bit generator seed from integer parts, stable across platforms and runs.

    Hashing the full tuple (not adding offsets) keeps streams for different tensors and
    chunks unrelated: a shared seed across tensors correlates their noise.
    """
    data = struct.pack(f"<{len(parts)}q", *(int(p) & 0x7FFFFFFFFFFFFFFF for p in parts))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


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
