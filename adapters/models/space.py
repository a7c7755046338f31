"""The real weights of a ``torch.nn.Module`` as a ParameterSpace (the LLM adapter's core).

Weights are edited in place chunk by chunk, so the module keeps serving forward passes with
no copy of itself: perturb, evaluate, restore exactly, update by seed replay. bf16/fp16
weights get an fp32 master copy on the host so that updates of ~1e-5 are not rounded away;
fp32 weights are backed up once per step. A tied tensor (e.g. embeddings shared with the LM
head) appears once in ``named_parameters`` and is therefore perturbed once.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence

import torch

from esbox.chunks import Chunk
from esbox.noise import DEFAULT_TABLE_SIZE
from esbox.space import ParameterSpace
from esbox.specs import Perturbation, Update

from .lowrank import LowRankSpecs

# Smaller than the core's 2**22: the space's scratch is a few chunks (noise buffers, a mask,
# update accumulators), and at 2**20 it stays near 20 MiB beside a model's weights, while
# a chunk is still large enough that per-chunk overhead is negligible.
MODEL_CHUNK_SIZE = 1 << 20


def select_parameters(
    module: torch.nn.Module,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
) -> list[tuple[str, torch.nn.Parameter]]:
    """Named parameters matching any ``include`` glob (all when None) and no ``exclude`` glob.

    Shared tensors are listed once (``named_parameters`` removes duplicates).
    """
    chosen = []
    for name, param in module.named_parameters():
        if include is not None and not any(fnmatch.fnmatchcase(name, p) for p in include):
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in exclude):
            continue
        chosen.append((name, param))
    if not chosen:
        names = [n for n, _ in module.named_parameters()][:8]
        raise ValueError(
            f"no parameter matches include={include} exclude={list(exclude)}; "
            f"parameter names look like: {', '.join(names)}"
        )
    return chosen


class TorchModuleSpace(LowRankSpecs, ParameterSpace):
    """All (or a name-selected subset of) the parameters of ``module``, perturbed in place.

    ``include``/``exclude`` are glob patterns on parameter names, e.g.
    ``include=["*.self_attn.*", "*.mlp.*"]``. ``backup_device`` holds the exact backup and
    the fp32 masters ("cpu" by default; the module's device when it fits and is asked for).
    ``noise="table"`` trades independent Gaussian draws for windows of a shared noise table,
    several times cheaper per member on CPU (see ``esbox.noise.NoiseTable``), and
    ``reflect_antithetic`` halves the draws of antithetic pairs (see ``ParameterSpace``).
    Specs with ``rank > 0`` are realised as low-rank noise on the 2-D weights (vectors frozen;
    see ``.lowrank``), and ``.batched.LowRankPopulation`` evaluates a whole low-rank
    population in shared forward passes without writing a weight.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
        chunk_size: int = MODEL_CHUNK_SIZE,
        backup_device: torch.device | str = "cpu",
        noise_threads: int | None = None,
        noise: str = "generator",
        table_size: int = DEFAULT_TABLE_SIZE,
        reflect_antithetic: bool = False,
    ) -> None:
        named = select_parameters(module, include, exclude)
        for name, param in named:
            if not param.is_contiguous():
                raise ValueError(
                    f"parameter {name} is not contiguous; it cannot be edited in place"
                )
            if not param.is_floating_point():
                raise ValueError(
                    f"parameter {name} has dtype {param.dtype}; only floats can be perturbed"
                )
        self.module = module
        self.names = [name for name, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        with torch.no_grad():
            super().__init__(
                [p for _, p in named],
                chunk_size=chunk_size,
                backup_device=backup_device,
                noise_threads=noise_threads,
                noise=noise,
                table_size=table_size,
                reflect_antithetic=reflect_antithetic,
            )

    def _write(self, perturbation: Perturbation) -> None:
        if perturbation.rank:
            self._write_lowrank(perturbation)
        else:
            super()._write(perturbation)

    def noise(self, perturbation: Perturbation) -> Iterator[tuple[Chunk, torch.Tensor]]:
        """As ``ParameterSpace.noise``; a low-rank member yields ``scale A B^T / sqrt(r)``."""
        if perturbation.rank:
            return self._lowrank_noise(perturbation)
        return super().noise(perturbation)

    def apply(self, update: Update) -> float:
        """As ``ParameterSpace.apply``; a low-rank update is replayed from its factors."""
        if update.rank:
            return self._apply_lowrank(update)
        return super().apply(update)
