"""Chunk-wise optimizers that turn a replayed gradient estimate into an ascent step.

State (momentum, Adam moments) lives next to the parameters, one fp32 buffer per tensor, so
replicas that apply the same updates stay identical. Adam costs 2 d floats of state.
"""

from __future__ import annotations

import torch

from esbox.errors import ConfigError
from esbox.specs import OptimizerSpec

OPTIMIZERS = ("sgd", "adam")


def validate_optimizer(spec: OptimizerSpec) -> None:
    """Raise ConfigError for an unknown optimizer or out-of-range hyper-parameter."""
    if spec.name not in OPTIMIZERS:
        raise ConfigError(f"optimizer '{spec.name}' is unknown (allowed: {', '.join(OPTIMIZERS)})")
    if not 0.0 <= spec.momentum < 1.0:
        raise ConfigError(f"momentum must be in [0, 1), got {spec.momentum}")
    if not (0.0 <= spec.beta1 < 1.0 and 0.0 <= spec.beta2 < 1.0):
        raise ConfigError(f"beta1 and beta2 must be in [0, 1), got {spec.beta1}, {spec.beta2}")
    if spec.weight_decay < 0:
        raise ConfigError(f"weight_decay must be >= 0, got {spec.weight_decay}")


class ChunkOptimizer:
    """Applies SGD (with optional momentum) or Adam, with decoupled weight decay, per chunk."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}
        self.steps = 0

    def _buffer(self, name: str, tensor_index: int, numel: int, like: torch.Tensor) -> torch.Tensor:
        key = f"{name}.{tensor_index}"
        if key not in self.state:
            self.state[key] = torch.zeros(numel, dtype=like.dtype, device=like.device)
        return self.state[key]

    def begin(self) -> None:
        """Mark the start of one update (Adam's bias correction counts updates)."""
        self.steps += 1

    def delta(
        self,
        spec: OptimizerSpec,
        tensor_index: int,
        numel: int,
        start: int,
        theta: torch.Tensor,
        grad: torch.Tensor,
        learning_rate: float,
    ) -> torch.Tensor:
        """The step to add to ``theta`` (a chunk at ``start`` of tensor ``tensor_index``).

        ``grad`` is the caller's scratch: the step may be computed in its storage.
        """
        stop = start + grad.numel()
        if spec.name == "adam":
            m = self._buffer("adam_m", tensor_index, numel, grad)[start:stop]
            v = self._buffer("adam_v", tensor_index, numel, grad)[start:stop]
            m.mul_(spec.beta1).add_(grad, alpha=1 - spec.beta1)
            v.mul_(spec.beta2).addcmul_(grad, grad, value=1 - spec.beta2)
            m_hat = torch.div(m, 1 - spec.beta1**self.steps, out=grad)
            v_hat = v / (1 - spec.beta2**self.steps)
            step = m_hat.div_(v_hat.sqrt_().add_(spec.eps)).mul_(learning_rate)
        elif spec.momentum > 0:
            velocity = self._buffer("momentum", tensor_index, numel, grad)[start:stop]
            velocity.mul_(spec.momentum).add_(grad)
            step = torch.mul(velocity, learning_rate, out=grad)
        else:
            step = grad.mul_(learning_rate)
        if spec.weight_decay:
            decayed = theta.to(device=step.device, dtype=step.dtype)  # master may be on the host
            step.add_(decayed, alpha=-learning_rate * spec.weight_decay)
        return step

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"optimizer.{k}": v for k, v in self.state.items()}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], steps: int) -> None:
        self.state = {
            k.removeprefix("optimizer."): v.clone()
            for k, v in tensors.items()
            if k.startswith("optimizer.")
        }
        self.steps = steps
