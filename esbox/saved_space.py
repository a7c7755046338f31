"""A space's state as named CPU tensors: what a checkpoint saves and loads (safetensors)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from esbox.errors import ResumeError
from esbox.optimizers import ChunkOptimizer
from esbox.scales import CoordinateScales


class SavedSpace:
    """Mixin of ``ParameterSpace``: ``state_dict`` / ``load_state_dict`` of its tensors."""

    _flat: list[torch.Tensor]
    _master: dict[int, torch.Tensor]
    _invalidate_backup: Callable[[], None]  # ParameterSpace: the backup is stale
    _optimizer: ChunkOptimizer
    _scales: CoordinateScales
    _table_size: int

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters, fp32 masters and optimizer state as named CPU tensors (safetensors-ready)."""
        out = {f"param.{i}": t.detach().cpu().clone() for i, t in enumerate(self._flat)}
        out.update({f"master.{i}": m.detach().cpu().clone() for i, m in self._master.items()})
        out.update({k: v.detach().cpu().clone() for k, v in self._optimizer.state_dict().items()})
        out.update(self._scales.state_dict())
        out["optimizer_steps"] = torch.tensor([self._optimizer.steps], dtype=torch.int64)
        out["noise_table_size"] = torch.tensor([self._table_size], dtype=torch.int64)
        return out

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load in place (storage addresses are kept); shapes, dtypes and noise must match."""
        saved_table = int(tensors.get("noise_table_size", torch.zeros(1))[0])
        if saved_table != self._table_size:
            raise ResumeError(
                f"the checkpoint was written with noise table size {saved_table} "
                f"(0: generator noise), this space uses {self._table_size}"
            )
        for i, flat in enumerate(self._flat):
            saved = tensors[f"param.{i}"]
            if saved.shape != flat.shape or saved.dtype != flat.dtype:
                raise ValueError(
                    f"tensor {i}: checkpoint has {tuple(saved.shape)} {saved.dtype}, "
                    f"space has {tuple(flat.shape)} {flat.dtype}"
                )
            flat.copy_(saved)
        for i, master in self._master.items():
            master.copy_(tensors[f"master.{i}"])
        optimizer = {
            k: v.to(self._flat[int(k.rsplit(".", 1)[1])].device)
            for k, v in tensors.items()
            if k.startswith("optimizer.")
        }
        self._optimizer.load_state_dict(optimizer, int(tensors["optimizer_steps"][0]))
        self._scales.load_state_dict(tensors)
        self._invalidate_backup()
