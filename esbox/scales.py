"""Per-coordinate noise scales s of a space: SNES's diagonal sigma, moved by seed replay."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from esbox.chunks import Chunk
from esbox.specs import Term


class CoordinateScales:
    """fp32 scales per tensor, ones until a diagonal update moves them. Allocated on first
    use, so a space that never sees a diagonal spec pays nothing."""

    def __init__(self, flat: Sequence[torch.Tensor]) -> None:
        self._flat = flat
        self._scales: dict[int, torch.Tensor] = {}

    def of(self, chunk: Chunk) -> torch.Tensor:
        """The scales of ``chunk`` (a view: writes go to the space's scales)."""
        i = chunk.tensor_index
        if i not in self._scales:
            flat = self._flat[i]
            self._scales[i] = torch.ones(flat.numel(), dtype=torch.float32, device=flat.device)
        return self._scales[i][chunk.start : chunk.stop]

    def gather(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Every scale, flat and in layout order (a copy on the CPU)."""
        return torch.cat([self.of(chunk).cpu() for chunk in chunks])

    def move(
        self, chunks: Sequence[Chunk], terms: Sequence[Term], noise: Iterator[torch.Tensor]
    ) -> None:
        """s <- s exp(sum_j c_j (eps_j^2 - 1)); ``noise`` yields eps of every term per chunk,
        chunk-major (the order of ``[(chunk, term) for chunk in chunks for term in terms]``)."""
        for chunk in chunks:
            scales = self.of(chunk)
            log_step = torch.zeros_like(scales)
            for term in terms:
                eps = next(noise)
                log_step.add_(eps * eps - 1.0, alpha=term.coefficient)
            scales.mul_(log_step.exp_())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The scales moved so far, as ``scale.{tensor}`` (absent: all ones)."""
        return {f"scale.{i}": s.detach().cpu().clone() for i, s in self._scales.items()}

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore from ``state_dict`` (other keys are ignored)."""
        self._scales = {}
        for key, value in tensors.items():
            if key.startswith("scale."):
                i = int(key.rsplit(".", 1)[1])
                self._scales[i] = value.to(self._flat[i].device, torch.float32).clone()
