"""Parameter spaces: own the parameters, realise perturbation and update specs by seed replay.

A space walks its tensors in a fixed chunk layout. Peak extra memory for perturb, restore and
update is one chunk of noise plus an exact backup (fp32/fp64 weights) or an fp32 master copy
(bf16/fp16 weights, so small updates are not rounded away).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

import numpy as np
import torch

from esbox.backup import ExactBackup
from esbox.chunks import Chunk, chunk_layout
from esbox.explicit import ExplicitSpecs
from esbox.lowrank import refuse_low_rank
from esbox.noise import (
    DEFAULT_TABLE_SIZE,
    NOISE_MODES,
    NoiseFiller,
    NoiseTable,
    allocate,
    derive_seed,
)
from esbox.optimizers import ChunkOptimizer, validate_optimizer
from esbox.partition import LayoutPartition
from esbox.saved_space import SavedSpace
from esbox.scales import CoordinateScales
from esbox.specs import Perturbation, Term, Update

DEFAULT_CHUNK_SIZE = 1 << 22
LOW_PRECISION = (torch.bfloat16, torch.float16)


class ParameterSpace(ExplicitSpecs, SavedSpace):
    """Parameters held as flat tensors, perturbed and updated chunk by chunk by seed replay.

    Subclasses hand over the tensors (``VectorSpace`` a vector, the torch adapter a module's
    weights). Tensors are edited in place, so their storage addresses never change.
    ``noise_threads`` CPU threads draw chunk noise ahead of its use (default: torch's thread
    count, at most 4); the noise is the same for any value. ``noise="table"`` takes each chunk's
    noise from a window of a shared seeded table instead (see ``NoiseTable``): much cheaper on
    CPU, at the price of overlapping windows. Replicas must use the same mode and table size.

    ``reflect_antithetic=True`` realises an antithetic twin that directly follows its partner
    in a sweep as ``2 * reference - x`` instead of drawing its noise again: half the noise
    draws for antithetic strategies. The twin then lies within a rounding of
    ``theta - sigma * eps`` rather than being that value bit for bit (DESIGN: restoring by
    arithmetic is an explicit option); runs stay reproducible, and the update is unchanged.
    """

    # True where the space realises low-rank specs (strategy option perturbation: lowrank);
    # make_strategy refuses a low-rank strategy on any other space before its first step
    supports_low_rank: ClassVar[bool] = False

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        backup_device: torch.device | str = "cpu",
        noise_threads: int | None = None,
        noise: str = "generator",
        table_size: int = DEFAULT_TABLE_SIZE,
        reflect_antithetic: bool = False,
    ) -> None:
        if noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {', '.join(NOISE_MODES)}, got {noise!r}")
        self._flat = [t.detach().view(-1) for t in tensors]
        self.chunk_size = chunk_size
        self.chunks, self._drawn = self._layout(chunk_size)
        self.backup_device = torch.device(backup_device)
        with torch.inference_mode(False):  # masters are updated outside inference mode
            self._master = {
                i: t.to(device=self.backup_device, dtype=torch.float32, copy=True)
                for i, t in enumerate(self._flat)
                if t.dtype in LOW_PRECISION
            }
        self._backup = ExactBackup(self.backup_device)
        self._optimizer = ChunkOptimizer()
        self._scales = CoordinateScales(self._flat)  # per-coordinate noise scales (SNES)
        largest = max((chunk.numel for chunk in self._drawn), default=1)
        threads = noise_threads if noise_threads is not None else min(torch.get_num_threads(), 4)
        self.noise_mode = noise
        table = NoiseTable(table_size) if noise == "table" else None
        self._table_size = table_size if table is not None else 0
        if table is not None and largest > table_size:
            raise ValueError(f"chunk_size {largest} exceeds the noise table ({table_size})")
        self._filler = NoiseFiller(largest, threads, table)
        self._perturbed = False
        self._partition = LayoutPartition(self._drawn, largest)
        self._update_buffers: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self.reflect_antithetic = reflect_antithetic
        # squared L2 norm of the last update's change per tensor (replicas that hold shards
        # of the same tensors sum them once per shard)
        self.update_squares: list[float] = [0.0] * len(self._flat)

    def _layout(self, chunk_size: int) -> tuple[list[Chunk], list[Chunk]]:
        """The chunks of the space's tensors and, position by position, the chunk whose noise
        and subspace mask each one draws: the same chunks here (a sharded space draws over
        its logical tensors, see ``esbox.sharded``)."""
        chunks = chunk_layout([t.numel() for t in self._flat], chunk_size)
        return chunks, chunks

    @property
    def dimension(self) -> int:
        """Number of scalar parameters in the space."""
        return sum(t.numel() for t in self._flat)

    # -- exact backup -------------------------------------------------------------------------
    def _ensure_backup(self) -> None:
        """Back up full-precision tensors once per step (low-precision ones have a master)."""
        self._backup.fill(self._flat, self._master)

    def _invalidate_backup(self) -> None:
        """The parameters moved (an update, a load): the next sweep refills the backup."""
        self._backup.stale = True

    def _reference(self, tensor_index: int) -> torch.Tensor:
        """The exact unperturbed values of a tensor: its fp32 master or its backup."""
        if tensor_index in self._master:
            return self._master[tensor_index]
        return self._backup[tensor_index]

    def _restore(self) -> None:
        for i, flat in enumerate(self._flat):
            flat.copy_(self._reference(i))
        self._perturbed = False

    def scales(self) -> torch.Tensor:
        """Every per-coordinate noise scale s (SNES), flat and in layout order (a copy)."""
        return self._scales.gather(self.chunks)

    # -- replayed noise -------------------------------------------------------------------------
    def _member_noise(
        self, run_seed: int, step: int, pairs: Sequence[tuple[Chunk, int]]
    ) -> Iterator[torch.Tensor]:
        """fp32 noise of each ``(chunk, member seed)`` pair, in order, read-only (reused
        buffers or views of the noise table)."""
        return self._filler.stream(
            [
                (
                    chunk.numel,
                    derive_seed(run_seed, step, seed, chunk.tensor_index, chunk.chunk_index),
                    self._flat[chunk.tensor_index].device,
                )
                for chunk, seed in pairs
            ]
        )

    def _mask(
        self,
        chunk_position: int,
        run_seed: int,
        step: int,
        spec: Term | Perturbation,
        shared: bool = True,
    ) -> torch.Tensor:
        """fp32 0/1 mask of ``spec``'s subspace over chunk ``chunk_position`` (read-only; see
        ``LayoutPartition.mask`` for ``shared``)."""
        device = self._flat[self.chunks[chunk_position].tensor_index].device
        return self._partition.mask(
            chunk_position,
            device,
            run_seed,
            step,
            spec.num_subspaces,
            spec.subspace,
            shared=shared,
        )

    def _directions(
        self, perturbation: Perturbation
    ) -> Iterator[tuple[Chunk, torch.Tensor, torch.Tensor | None]]:
        """Yield ``(chunk, eps, mask)`` for every chunk: the fp32 noise (a reused buffer or a
        view of the noise table) and the 0/1 mask of the member's subspace (a view of a shared
        buffer; None without subspaces), both read-only. Kept apart so a write can fuse the
        masking."""
        p = perturbation
        refuse_low_rank(p.rank)
        pairs = [(c, p.seed) for c in self.chunks]
        stream = self._member_noise(p.run_seed, p.step, pairs)
        for position, (chunk, eps) in enumerate(zip(self.chunks, stream, strict=True)):
            mask = self._mask(position, p.run_seed, p.step, p) if p.num_subspaces > 1 else None
            yield chunk, eps, mask

    def noise(self, perturbation: Perturbation) -> Iterator[tuple[Chunk, torch.Tensor]]:
        """Yield ``(chunk, scale * mask * eps)`` for every chunk (fp32, a fresh tensor each); an
        explicit member yields its displacement (``explicit_noise``)."""
        if perturbation.values is not None:
            yield from self.explicit_noise(perturbation)
            return
        for chunk, eps, mask in self._directions(perturbation):
            direction = eps if mask is None else mask * eps
            if perturbation.diagonal:
                direction = direction * self._scales.of(chunk)
            yield chunk, direction * perturbation.scale

    # -- perturb / restore ------------------------------------------------------------------
    @contextmanager
    def sweep(self, perturbations: Sequence[Perturbation]) -> Iterator[Iterator[Perturbation]]:
        """Hold the parameters at each member in turn; restore them exactly on exit.

        ::

            with space.sweep(perturbations) as members:
                rewards = [evaluate(p) for p in members]

        Each member is written from the exact backup (or fp32 master), so the parameters need
        no restore between members: one restore per sweep. The restore runs even when the
        body raises, so a failing evaluation never leaves perturbed weights behind. With
        ``reflect_antithetic`` an antithetic twin that directly follows its partner is
        realised by reflecting about the backup (see the class docstring).
        """
        if self._perturbed:
            raise RuntimeError("perturbations do not nest: the space is already perturbed")
        self._ensure_backup()
        self._perturbed = True
        try:
            yield self._walk(perturbations)
        finally:
            self._restore()

    def _walk(self, perturbations: Sequence[Perturbation]) -> Iterator[Perturbation]:
        previous = None
        for p in perturbations:
            if not self._perturbed:
                raise RuntimeError("the sweep has ended: iterate its members inside the with")
            if self.reflect_antithetic and previous is not None and p.mirrors(previous):
                self._reflect()
            elif p.values is not None:
                self._place(p)
            else:
                self._write(p)
            previous = p
            yield p

    @contextmanager
    def perturbed(self, perturbation: Perturbation) -> Iterator[ParameterSpace]:
        """Hold the parameters at ``theta + perturbation`` and restore them exactly on exit
        (a sweep of one member)."""
        with self.sweep([perturbation]) as members:
            next(members)
            yield self

    def _write(self, perturbation: Perturbation) -> None:
        """Set every chunk to ``reference + scale * mask * eps``."""
        scale = perturbation.scale
        for chunk, eps, mask in self._directions(perturbation):
            if perturbation.diagonal:
                eps = eps * self._scales.of(chunk)
            flat = self._flat[chunk.tensor_index]
            ref = self._reference(chunk.tensor_index)[chunk.start : chunk.stop]
            target = flat[chunk.start : chunk.stop]
            if ref.device == flat.device:
                # at the reference's precision; a low-precision chunk goes through the reused
                # scratch and is rounded once on the copy (torch would allocate a temporary)
                out = target if ref.dtype == flat.dtype else self._wide(ref, chunk.numel)
                if mask is None:
                    torch.add(ref, eps, alpha=scale, out=out)
                else:  # one pass: ref + scale * mask * eps
                    torch.addcmul(ref, mask, eps, value=scale, out=out)
                if out is not target:
                    target.copy_(out)
            else:
                direction = eps if mask is None else mask * eps  # the mask is shared
                dtype = torch.promote_types(ref.dtype, direction.dtype)
                value = ref.to(device=direction.device, dtype=dtype, copy=True)
                target.copy_(value.add_(direction, alpha=scale))

    def _reflect(self) -> None:
        """Move every chunk from ``reference + delta`` to ``reference - delta`` (no noise drawn)."""
        for chunk in self.chunks:
            flat = self._flat[chunk.tensor_index]
            ref = self._reference(chunk.tensor_index)[chunk.start : chunk.stop]
            target = flat[chunk.start : chunk.stop]
            if ref.dtype == flat.dtype and ref.device == flat.device:
                target.lerp_(ref, 2.0)
            elif ref.device == flat.device:
                target.copy_(self._wide(ref, chunk.numel).copy_(target).lerp_(ref, 2.0))
            else:
                value = target.to(device=ref.device, dtype=ref.dtype)
                target.copy_(value.lerp_(ref, 2.0))

    # -- updates -------------------------------------------------------------------------------
    def apply(self, update: Update) -> float:
        """Apply an update by replay; returns the L2 norm of the parameter change."""
        if self._perturbed:
            raise RuntimeError("cannot apply an update while the space is perturbed")
        if update.shift is not None:
            if update.restart:  # a new search: no momentum, moments or scales carried over
                self._optimizer, self._scales = ChunkOptimizer(), CoordinateScales(self._flat)
                return self._move_to(update.shift)
            return self._shift(update.shift)
        refuse_low_rank(update.rank)
        validate_optimizer(update.optimizer)
        self._optimizer.begin()
        groups = update.subspace_groups()
        pairs = [(c, t.seed) for c in self.chunks for terms in groups for t in terms]
        stream = self._member_noise(update.run_seed, update.step, pairs)
        squares = [0.0] * len(self._flat)
        for position, chunk in enumerate(self.chunks):
            flat = self._flat[chunk.tensor_index]
            theta = self._master.get(chunk.tensor_index, flat)[chunk.start : chunk.stop]
            acc_dtype = torch.float64 if theta.dtype == torch.float64 else torch.float32
            grad_buffer, acc_buffer = self._update_scratch(flat.device, acc_dtype)
            grad = grad_buffer[: chunk.numel].zero_()
            for terms in groups:
                masked = terms[0].num_subspaces > 1
                acc = acc_buffer[: chunk.numel].zero_() if masked else grad
                for term in terms:
                    acc.add_(next(stream).to(acc_dtype), alpha=term.coefficient)
                if masked:  # subspaces are disjoint: mask a subspace's sum once, not each term
                    # every subspace at each chunk: compare the chunk's window alone
                    mask = self._mask(
                        position, update.run_seed, update.step, terms[0], shared=False
                    )
                    grad.add_(acc.mul_(mask))
            if update.diagonal:
                grad.mul_(self._scales.of(chunk))
            delta = self._optimizer.delta(
                update.optimizer,
                chunk.tensor_index,
                flat.numel(),
                chunk.start,
                theta,
                grad,
                update.learning_rate,
            )
            change = float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2
            squares[chunk.tensor_index] += change
            theta.add_(delta.to(device=theta.device, dtype=theta.dtype))
            if chunk.tensor_index in self._master:
                flat[chunk.start : chunk.stop].copy_(theta)
        if update.scale_terms:  # after the step, which used the scales before this update
            terms = update.scale_terms
            pairs = [(c, t.seed) for c in self.chunks for t in terms]
            noise = self._member_noise(update.run_seed, update.step, pairs)
            self._scales.move(self.chunks, terms, noise)
        self._invalidate_backup()
        self.update_squares = squares
        return math.sqrt(sum(squares))

    def _update_scratch(
        self, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Two chunk-sized accumulators (the step's gradient and a subspace's sum), allocated
        once and reused by every chunk of every update: no allocator churn between chunks."""
        key = (device, dtype)
        if key not in self._update_buffers:
            self._update_buffers[key] = allocate(2 * self._partition.span, dtype, device)
        both = self._update_buffers[key]
        return both[: self._partition.span], both[self._partition.span :]

    def _wide(self, ref: torch.Tensor, numel: int) -> torch.Tensor:
        """Scratch for a low-precision chunk's value at its master's precision: the update's
        second accumulator, free while the space is perturbed (no update can run then)."""
        return self._update_scratch(ref.device, ref.dtype)[1][:numel]


class VectorSpace(ParameterSpace):
    """A flat float32 or float64 vector, for black-box functions of R^d."""

    def __init__(
        self,
        x0: np.ndarray | Sequence[float] | torch.Tensor,
        *,
        dtype: str | torch.dtype = "float64",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> None:
        torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if torch_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"VectorSpace dtype must be float32 or float64, got {dtype}")
        x = torch.as_tensor(np.asarray(x0, dtype=np.float64)).to(torch_dtype).reshape(-1).clone()
        if x.numel() == 0:
            raise ValueError("x0 must have at least one element")
        if not torch.isfinite(x).all():
            raise ValueError("x0 must be finite")
        self._x = x
        super().__init__([x], chunk_size=chunk_size)

    @property
    def vector(self) -> np.ndarray:
        """A numpy view of the current (possibly perturbed) vector; copy it to keep it."""
        return self._x.numpy()

    def materialize(self, perturbation: Perturbation) -> np.ndarray:
        """A copy of ``theta + perturbation`` (the parameters themselves are left untouched)."""
        with self.perturbed(perturbation):
            return self._x.numpy().copy()
