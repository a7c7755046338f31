"""Explicit specs on a space: a member at ``theta + values``, an update ``theta += shift``.

Strategies that propose points rather than seeds (nevergrad) send each candidate as its
displacement from the current parameters and each step as a displacement too, so a space
realises them with no optimizer at hand: chunk by chunk, from the same exact backup as a seeded
member. The sum is taken in float64 and rounded once to the parameters' dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch

from esbox.chunks import Chunk
from esbox.specs import Perturbation


class ExplicitSpecs:
    """Mixin of ``ParameterSpace``: realises ``Perturbation.values`` and ``Update.shift``."""

    _flat: list[torch.Tensor]
    _master: dict[int, torch.Tensor]
    _invalidate_backup: Callable[[], None]  # ParameterSpace: the backup is stale
    chunks: list[Chunk]
    _reference: Callable[[int], torch.Tensor]  # ParameterSpace's exact backup or fp32 master
    update_squares: list[float]

    def _explicit_chunks(
        self, values: Sequence[float], what: str
    ) -> Iterator[tuple[Chunk, torch.Tensor]]:
        """``(chunk, its slice of values)`` for every chunk, float64 on the chunk's device."""
        size = sum(t.numel() for t in self._flat)
        if len(values) != size:
            raise ValueError(f"{what} has {len(values)} values for a space of {size}")
        vector = torch.tensor(values, dtype=torch.float64)
        for chunk in self.chunks:
            part = vector[chunk.global_start : chunk.global_start + chunk.numel]
            yield chunk, part.to(self._flat[chunk.tensor_index].device)

    def explicit_noise(self, perturbation: Perturbation) -> Iterator[tuple[Chunk, torch.Tensor]]:
        """Yield ``(chunk, displacement)`` of an explicit member (float64, a fresh tensor each)."""
        assert perturbation.values is not None
        for chunk, part in self._explicit_chunks(perturbation.values, "an explicit member"):
            yield chunk, part.clone()

    def _place(self, perturbation: Perturbation) -> None:
        """Set every chunk to ``reference + values`` (exact backup or master as reference)."""
        assert perturbation.values is not None
        for chunk, part in self._explicit_chunks(perturbation.values, "an explicit member"):
            ref = self._reference(chunk.tensor_index)[chunk.start : chunk.stop]
            value = ref.to(device=part.device, dtype=torch.float64) + part
            self._flat[chunk.tensor_index][chunk.start : chunk.stop].copy_(value)

    def _move_to(self, point: Sequence[float]) -> float:
        """``theta <- point`` (a restart's start: ``Update.restart``) as ``theta += point -
        theta`` in float64; returns the L2 norm of the move."""
        current = [
            self._master.get(c.tensor_index, self._flat[c.tensor_index])[c.start : c.stop]
            for c in self.chunks
        ]
        theta = torch.cat([part.detach().to("cpu", torch.float64) for part in current])
        return self._shift((torch.tensor(point, dtype=torch.float64) - theta).tolist())

    def _shift(self, shift: Sequence[float]) -> float:
        """``theta += shift`` (masters too); returns the L2 norm of the shift."""
        squares = [0.0] * len(self._flat)
        for chunk, part in self._explicit_chunks(shift, "an explicit update"):
            flat = self._flat[chunk.tensor_index]
            theta = self._master.get(chunk.tensor_index, flat)[chunk.start : chunk.stop]
            theta.copy_(theta.to(device=part.device, dtype=torch.float64) + part)
            if chunk.tensor_index in self._master:
                flat[chunk.start : chunk.stop].copy_(theta)
            change = float(part.square().sum())
            squares[chunk.tensor_index] += change
        self._invalidate_backup()
        self.update_squares = squares
        return math.sqrt(sum(squares))
