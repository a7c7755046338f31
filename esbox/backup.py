"""A space's exact backup: the unperturbed values of its full-precision tensors, taken once a
step so that every member is written from it and the sweep restores it bit for bit."""

from __future__ import annotations

from collections.abc import Container, Sequence

import torch


class ExactBackup:
    """Copies of a space's tensors on ``device``, refilled after the parameters move.

    The buffers are allocated at the first fill and refilled in place afterwards: a fresh
    allocation of the model's size paid its page faults again every step (most of a backup's
    time on CPU).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._copies: dict[int, torch.Tensor] | None = None
        self.stale = True

    def fill(self, flat: Sequence[torch.Tensor], skip: Container[int]) -> None:
        """Copy every tensor of ``flat`` but those in ``skip`` (they have an fp32 master),
        unless the copies are current."""
        if self._copies is None:
            with torch.inference_mode(False):  # kept across steps, written outside it too
                self._copies = {
                    i: t.to(device=self.device, copy=True)
                    for i, t in enumerate(flat)
                    if i not in skip
                }
        elif self.stale:
            for i, copy in self._copies.items():
                copy.copy_(flat[i])
        self.stale = False

    def __getitem__(self, tensor_index: int) -> torch.Tensor:
        assert self._copies is not None and not self.stale, "the backup is not current"
        return self._copies[tensor_index]
