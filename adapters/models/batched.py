"""One batched forward for a whole low-rank population: per-row noise added inside the layers.

With low-rank noise, ``x (W + s_i A_i B_i^T / sqrt(r))^T = x W^T + (s_i / sqrt(r)) (x B_i)
A_i^T``: every member shares the unperturbed weights, and member i's term costs two thin
matmuls on its own rows. ``LowRankPopulation`` installs forward hooks that add this term on the
``nn.Linear`` and ``nn.Embedding`` modules holding the space's matrices; no weight is written.
Rows must come member-major: a forward over ``N x R`` rows gives rows ``i R .. (i + 1) R - 1``
to member i (any R, so a shared prefix runs once per member as ``N`` rows).

A tied weight (input embeddings shared with the LM head) is one tensor of the space with one
pair of factors, used by both modules: the embedding adds ``A[ids] B^T`` to its rows, the head
``(x B) A^T`` to its logits, exactly as writing ``W + s A B^T`` would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import torch

from esbox.lowrank import factors
from esbox.specs import Perturbation

from .space import TorchModuleSpace


class LowRankPopulation:
    """While open, forwards of ``space.module`` evaluate every member of ``perturbations`` on
    its own rows (member-major), through forward hooks; closing removes the hooks.

    The factors of all members are held for the sweep: ``N r sum(m + n)`` floats in the
    model's dtype (a member outside a matrix's CoPES subset gets zeros and a zero scale).
    """

    def __init__(self, space: TorchModuleSpace, perturbations: Sequence[Perturbation]) -> None:
        if not perturbations:
            raise ValueError("a low-rank population needs at least one member")
        first = perturbations[0]
        for p in perturbations:
            if p.rank < 1 or p.values is not None or p.diagonal:
                raise ValueError(
                    "batched evaluation needs seeded low-rank members (rank >= 1, no explicit "
                    "values, not diagonal); evaluate others with space.sweep"
                )
            if (p.run_seed, p.step, p.rank) != (first.run_seed, first.step, first.rank):
                raise ValueError("a batched population shares one run seed, step and rank")
        self.space = space
        self.perturbations = list(perturbations)
        self.size = len(perturbations)
        self._handles: list[Any] = []
        self._factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __enter__(self) -> LowRankPopulation:
        if self.space.sweeping:
            raise RuntimeError("the space is perturbed: close its sweep first")
        owners = self._owners()
        moved = [set(self.space.lowrank_tensors(p, p.run_seed, p.step)) for p in self.perturbations]
        try:
            for i in {i for _, i in owners}:
                self._factors[i] = self._stack(i, [i in m for m in moved])
            for module, i in owners:
                hook = _embedding_hook if isinstance(module, torch.nn.Embedding) else _linear_hook
                self._handles.append(
                    module.register_forward_hook(_bind(hook, self._factors[i], self.size))
                )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Remove the hooks and drop the factors (safe to call twice)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._factors.clear()

    def _owners(self) -> list[tuple[torch.nn.Module, int]]:
        """``(module, tensor index)`` for every module whose weight is a matrix of the space;
        a matrix held by any other kind of module is refused (its forward is unknown)."""
        by_id = {self.space.matrix(i).data_ptr(): i for i in self.space.matrices}
        owners, seen = [], set()
        for name, module in self.space.module.named_modules():
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.Tensor):
                continue
            i = by_id.get(weight.data_ptr())
            if i is None:
                continue
            if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                raise TypeError(
                    f"{name} ({type(module).__name__}) holds the selected matrix "
                    f"{self.space.names[i]}: batched low-rank evaluation supports nn.Linear and "
                    f"nn.Embedding weights; exclude it or evaluate with space.sweep"
                )
            owners.append((module, i))
            seen.add(i)
        missing = [self.space.names[i] for i in self.space.matrices if i not in seen]
        if missing:
            raise TypeError(
                f"no nn.Linear or nn.Embedding holds the selected matrices {missing[:4]}: "
                f"exclude them or evaluate with space.sweep"
            )
        return owners

    def _stack(self, i: int, moves: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B (N, n, r), C (N, r, m))`` of matrix ``i`` in the weight's dtype, with
        ``C_j = (s_j / sqrt(r)) A_j^T`` (zeros where ``moves[j]`` is False: the member's
        CoPES subset leaves the matrix out):
        the scale folded in and both laid out for ``bmm``, so a hook is two batched matmuls."""
        weight = self.space.matrix(i)
        rows, cols = weight.shape
        rank = self.perturbations[0].rank
        b_all = torch.zeros(self.size, cols, rank, dtype=weight.dtype, device=weight.device)
        c_all = torch.zeros(self.size, rank, rows, dtype=weight.dtype, device=weight.device)
        for j, p in enumerate(self.perturbations):
            if not moves[j]:
                continue
            a, b = factors(p.run_seed, p.step, p.seed, i, (rows, cols), rank, weight.device)
            b_all[j].copy_(b)
            c_all[j].copy_(a.T.mul_(p.scale / math.sqrt(rank)))
        return b_all, c_all


def _bind(hook: Any, held: tuple[torch.Tensor, ...], size: int) -> Any:
    return lambda module, args, output: hook(held, size, args[0], output)


def _member_view(tensor: torch.Tensor, size: int, last: int | None = None) -> torch.Tensor:
    """``(N, rows/N * ..., last)``: the rows of each member together (member-major rows)."""
    if tensor.shape[0] % size:
        raise RuntimeError(
            f"a batched low-rank forward got {tensor.shape[0]} rows for {size} members: rows "
            f"must be a multiple of the population, member-major"
        )
    return tensor.reshape(size, -1, tensor.shape[-1] if last is None else last)


def _linear_hook(
    held: tuple[torch.Tensor, ...], size: int, x: torch.Tensor, output: torch.Tensor
) -> torch.Tensor:
    """``y + s_i (x B_i) A_i^T / sqrt(r)`` for each member's rows (in place on ``y``)."""
    b, c = held
    low = torch.bmm(_member_view(x, size).to(b.dtype), b)
    return _member_view(output, size).baddbmm_(low, c).view_as(output)


def _embedding_hook(
    held: tuple[torch.Tensor, ...], size: int, ids: torch.Tensor, output: torch.Tensor
) -> torch.Tensor:
    """``W[ids] + s_i A_i[ids] B_i^T / sqrt(r)`` for each member's rows (in place)."""
    b, c = held
    index = _member_view(ids, size, 1).view(size, 1, -1)  # (N, 1, L): each member's ids
    low = torch.gather(c, 2, index.expand(-1, c.shape[1], -1))  # (N, r, L)
    out = _member_view(output, size)
    return out.baddbmm_(low.transpose(1, 2), b.transpose(1, 2)).view_as(output)
