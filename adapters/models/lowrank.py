"""Low-rank specs on a model's weights: realise ``rank > 0`` members and updates by replay.

A member with ``rank = r`` perturbs every 2-D weight ``W`` (m x n) of the space, or the
matrices of its CoPES subset, by ``scale * A B^T / sqrt(r)`` (``esbox.lowrank``); 1-D
parameters (norm scales, biases) stay frozen in this mode. Writing a member goes through the
same exact backup / fp32 master as a full-rank one, a row block at a time (one ``addmm``, no
m x n temporary for full-precision weights). An update ``sum_j c_j A_j B_j^T / sqrt(r)`` is
formed a row block at a time from the stacked factors (``(m + n) r`` floats a term) and goes
through the same chunk optimizers (SGD, momentum, Adam, weight decay) in fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

import torch

from esbox.chunks import Chunk
from esbox.errors import ConfigError
from esbox.lowrank import factors, matrix_labels, row_blocks, stacked_factors
from esbox.optimizers import ChunkOptimizer, validate_optimizer
from esbox.specs import Perturbation, Term, Update


class LowRankSpecs:
    """Mixin of ``TorchModuleSpace``: realises perturbations and updates with ``rank > 0``."""

    supports_low_rank: ClassVar[bool] = True

    _flat: list[torch.Tensor]
    _master: dict[int, torch.Tensor]
    _invalidate_backup: Callable[[], None]  # ParameterSpace: the backup is stale
    _optimizer: ChunkOptimizer
    _perturbed: bool
    chunks: list[Chunk]
    chunk_size: int
    shapes: list[tuple[int, ...]]
    _reference: Callable[[int], torch.Tensor]  # ParameterSpace's exact backup or fp32 master

    @property
    def matrices(self) -> list[int]:
        """Tensor indices of the space's 2-D weights: what low-rank members perturb."""
        return [i for i, shape in enumerate(self.shapes) if len(shape) == 2]

    def matrix_shape(self, tensor_index: int) -> tuple[int, int]:
        """``(rows, cols)`` of a 2-D tensor of the space."""
        rows, cols = self.shapes[tensor_index]
        return rows, cols

    def matrix(self, tensor_index: int) -> torch.Tensor:
        """The live weight of a 2-D tensor of the space (read it, never write it)."""
        return self._flat[tensor_index].view(self.matrix_shape(tensor_index))

    @property
    def sweeping(self) -> bool:
        """True while a sweep holds the parameters at a member."""
        return self._perturbed

    def lowrank_tensors(self, spec: Perturbation | Term, run_seed: int, step: int) -> list[int]:
        """The matrices a low-rank member (or term) moves: all, or its CoPES subset."""
        matrices = self.matrices
        if not matrices:
            raise ConfigError(
                "strategy option perturbation 'lowrank' needs 2-D weights; the selected "
                "parameters are all vectors (perturbation 'full' perturbs them)"
            )
        k = spec.num_subspaces
        if k <= 1:
            return matrices
        if k > len(matrices):
            raise ConfigError(
                f"{k} subspaces of {len(matrices)} weight matrices: low-rank subspaces are "
                f"subsets of whole matrices, so subspaces must be at most {len(matrices)}"
            )
        labels = matrix_labels(run_seed, step, k, len(matrices))
        return [i for i, label in zip(matrices, labels, strict=True) if label == spec.subspace]

    def _lowrank_factors(self, p: Perturbation, tensor_index: int) -> tuple[torch.Tensor, ...]:
        shape = self.matrix_shape(tensor_index)
        device = self._flat[tensor_index].device
        return factors(p.run_seed, p.step, p.seed, tensor_index, shape, p.rank, device)

    def _check_lowrank(self, spec: Perturbation | Update) -> None:
        if spec.diagonal:
            raise ConfigError("diagonal (SNES) specs have no low-rank form: use perturbation full")

    # -- members ------------------------------------------------------------------------------
    def _write_lowrank(self, p: Perturbation) -> None:
        """Set every matrix of the member's subset to ``reference + scale A B^T / sqrt(r)``
        and every other tensor to its reference."""
        self._check_lowrank(p)
        moved = set(self.lowrank_tensors(p, p.run_seed, p.step))
        alpha = p.scale / math.sqrt(p.rank)
        for i, flat in enumerate(self._flat):
            ref = self._reference(i)
            if i not in moved:
                flat.copy_(ref)
                continue
            a, b = self._lowrank_factors(p, i)
            rows, cols = self.matrix_shape(i)
            ref2, target2 = ref.view(rows, cols), flat.view(rows, cols)
            for lo, hi in row_blocks(rows, cols, self.chunk_size):
                if ref.device == flat.device and ref.dtype == flat.dtype:
                    a_block, b_t = a[lo:hi].to(ref.dtype), b.T.to(ref.dtype)
                    torch.addmm(ref2[lo:hi], a_block, b_t, alpha=alpha, out=target2[lo:hi])
                else:  # through the fp32 master (bf16/fp16 weights): rounded once on the copy
                    wide = ref2[lo:hi].to(device=flat.device, dtype=a.dtype)
                    target2[lo:hi].copy_(torch.addmm(wide, a[lo:hi], b.T, alpha=alpha))

    def _lowrank_noise(self, p: Perturbation) -> Iterator[tuple[Chunk, torch.Tensor]]:
        """``(chunk, scale A B^T / sqrt(r))`` over the layout (zeros outside the subset)."""
        self._check_lowrank(p)
        moved = set(self.lowrank_tensors(p, p.run_seed, p.step))
        alpha = p.scale / math.sqrt(p.rank)
        held: tuple[int, tuple[torch.Tensor, ...]] | None = None
        for chunk in self.chunks:
            i = chunk.tensor_index
            device = self._flat[i].device
            if i not in moved:
                yield chunk, torch.zeros(chunk.numel, dtype=torch.float32, device=device)
                continue
            if held is None or held[0] != i:
                held = (i, self._lowrank_factors(p, i))
            a, b = held[1]
            cols = self.matrix_shape(i)[1]
            lo, hi = chunk.start // cols, -(-chunk.stop // cols)
            block = (a[lo:hi] @ b.T).view(-1).mul_(alpha)
            yield chunk, block[chunk.start - lo * cols : chunk.stop - lo * cols]

    # -- updates ------------------------------------------------------------------------------
    def _apply_lowrank(self, update: Update) -> float:
        """theta <- opt(theta, sum_j c_j A_j B_j^T / sqrt(r)) on every matrix, by replay in
        fp32 (masters for bf16/fp16); returns the L2 norm of the change."""
        if self._perturbed:
            raise RuntimeError("cannot apply an update while the space is perturbed")
        self._check_lowrank(update)
        validate_optimizer(update.optimizer)
        self._optimizer.begin()
        weighted: dict[int, list[tuple[int, float]]] = {i: [] for i in self.matrices}
        for term in update.terms:
            for i in self.lowrank_tensors(term, update.run_seed, update.step):
                weighted[i].append((term.seed, term.coefficient))
        squared = 0.0
        for i, pairs in weighted.items():
            squared += self._step_matrix(update, i, pairs)
        self._invalidate_backup()
        return math.sqrt(squared)

    def _step_matrix(self, update: Update, i: int, pairs: Sequence[tuple[int, float]]) -> float:
        """One matrix's optimizer step, a row block at a time; returns its squared norm."""
        flat = self._flat[i]
        theta = self._master.get(i, flat)
        rows, cols = self.matrix_shape(i)
        acc_dtype = torch.float64 if theta.dtype == torch.float64 else torch.float32
        stacked = None
        if pairs:
            run, step, rank = update.run_seed, update.step, update.rank
            shape = (rows, cols)
            stacked = stacked_factors(run, step, pairs, i, shape, rank, flat.device)
        squared = 0.0
        for lo, hi in row_blocks(rows, cols, self.chunk_size):
            start, stop = lo * cols, hi * cols
            if stacked is None:
                grad = torch.zeros(stop - start, dtype=acc_dtype, device=flat.device)
            else:
                grad = (stacked[0][lo:hi] @ stacked[1].T).view(-1).to(acc_dtype)
            part = theta[start:stop]
            delta = self._optimizer.delta(
                update.optimizer, i, flat.numel(), start, part, grad, update.learning_rate
            )
            squared += float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2
            part.add_(delta.to(device=part.device, dtype=part.dtype))
            if i in self._master:
                flat[start:stop].copy_(part)
        return squared
