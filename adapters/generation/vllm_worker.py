"""vLLM worker side of the vLLM backend: a parameter space over the weights in a vLLM worker.

:class:`EsboxWorkerExtension` is a vLLM *worker extension* (``vllm.LLM(...,
worker_extension_cls=WORKER_EXTENSION)``). In each worker it builds a parameter space over the
worker's model and exposes ``esbox_*`` methods that ``llm.collective_rpc`` calls. Only spec
dicts (seeds and scalars) cross the wire; the noise is regenerated in the worker. The driver
side (:mod:`esbox.adapters.generation.vllm_driver`) holds ``VLLMSpace``, ``VLLMBackend`` and
``make_llm``; the tensor layouts are in :mod:`.vllm_tensors`. Importing this module (vLLM does,
to resolve the extension) keeps a CPU worker's linear weights editable
(:func:`.vllm_cpu.use_live_cpu_weights`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from esbox.adapters.models.space import TorchModuleSpace
from esbox.sharded import Block, ShardedTensorSpace, shard_state
from esbox.space import ParameterSpace
from esbox.specs import Perturbation, Update

from .vllm_cpu import use_live_cpu_weights
from .vllm_rpc import digest, pack_tensors, reported, unpack_tensors
from .vllm_shards import check_logical_shapes, tensor_parallel_shards
from .vllm_tensors import (
    NamedTensorSpace,
    check_not_repacked,
    hf_parameter_shapes,
    logical_tensors,
    order_like,
    select,
)

WORKER_EXTENSION = "esbox.adapters.generation.vllm_worker.EsboxWorkerExtension"

use_live_cpu_weights()


class _Feed:
    """The members of a worker's open sweep: each ``esbox_member`` RPC queues one and
    advances the space's sweep by one."""

    def __init__(self) -> None:
        self.pending: list[Perturbation] = []

    def __iter__(self) -> _Feed:
        return self

    def __next__(self) -> Perturbation:
        if not self.pending:
            raise RuntimeError("no member queued")  # pragma: no cover - internal misuse
        return self.pending.pop(0)


# -- the worker extension --------------------------------------------------------------------------
class EsboxWorkerExtension:
    """Mixed into each vLLM worker: a parameter space over the worker's model, driven by RPC.

    Every method name starts with ``esbox_`` (vLLM refuses extensions that shadow worker
    attributes). Arguments and results are plain dicts, lists, strings and numbers, and
    safetensors bytes for tensors (vLLM's msgpack RPC turns tensors into lists). A worker
    method's exception comes back as a value that the driver raises again.
    """

    @reported
    def esbox_init(self, options: dict[str, Any]) -> dict[str, Any]:
        """Build the space (replacing any earlier one); returns its tensors' logical names,
        shapes, numels and dtypes, their device, the chunk size and, in a tensor-parallel
        worker, the block of each tensor it holds (``Block.to_list``; None otherwise)."""
        options = dict(options)
        layout = options.pop("layout", "hf")
        include = options.pop("include", None)
        exclude = options.pop("exclude", ())
        config = self.vllm_config  # type: ignore[attr-defined]
        parallel = config.parallel_config
        if parallel.pipeline_parallel_size != 1:
            raise ValueError(
                "pipeline_parallel_size must be 1: esbox's vLLM space does not follow layers "
                "split across workers (tensor_parallel_size may be more than 1)"
            )
        model = self.get_model()  # type: ignore[attr-defined]
        blocks: list[Block] | None = None
        if parallel.tensor_parallel_size > 1:
            sharded, hf_shapes = self._sharded_space(model, layout, include, exclude, options)
            space: ParameterSpace = sharded
            blocks = sharded.blocks
            named = list(zip(sharded.names, sharded._flat, strict=True))
        elif layout == "vllm":
            check_not_repacked(logical_tensors(model, "vllm"))
            space = TorchModuleSpace(model, include=include, exclude=exclude, **options)
            named = list(zip(space.names, space._flat, strict=True))
        else:
            order = self._hf_shapes(config)
            tensors = order_like(logical_tensors(model, layout), list(order))
            named = select(tensors, include, exclude)
            space = NamedTensorSpace(named, **options)
        self.esbox_space = space
        self.esbox_sweep_state: tuple[Any, Iterator[Perturbation], _Feed] | None = None
        if blocks is not None:  # the logical tensors
            shapes = [list(hf_shapes[n]) for n, _ in named]
            numels = [b.logical_numel for b in blocks]
        else:
            shapes = [list(t.shape) for _, t in named]
            numels = [t.numel() for _, t in named]
        return {
            "names": [n for n, _ in named],
            "shapes": shapes,
            "numels": numels,
            "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in named],
            "device": str(named[0][1].device),
            "chunk_size": space.chunk_size,
            "blocks": [b.to_list() for b in blocks] if blocks else None,
        }

    @staticmethod
    def _hf_shapes(config: Any) -> dict[str, tuple[int, ...]]:
        try:
            return hf_parameter_shapes(config.model_config.hf_config)
        except Exception as exc:
            raise ValueError(
                f"cannot build the transformers model of this config ({exc}); "
                "use layout='vllm' to define the noise per vLLM tensor"
            ) from exc

    def _sharded_space(
        self,
        model: torch.nn.Module,
        layout: str,
        include: list[str] | None,
        exclude: list[str],
        options: dict[str, Any],
    ) -> tuple[ShardedTensorSpace, dict[str, tuple[int, ...]]]:
        """A tensor-parallel worker's space (its blocks of the logical tensors) and the
        logical tensors' shapes."""
        if layout != "hf":
            raise ValueError(
                "a tensor-parallel engine needs layout='hf' (the noise of the whole logical "
                "tensors, which every worker draws and writes its part of)"
            )
        shapes = self._hf_shapes(self.vllm_config)  # type: ignore[attr-defined]
        check_not_repacked([(n, p.data) for n, p in model.named_parameters()])
        shards = tensor_parallel_shards(model)
        check_logical_shapes(shards, shapes)
        by_name = {name: (tensor, block) for name, tensor, block in shards}
        ordered = [(name, by_name[name][0]) for name in shapes]
        chosen = select(ordered, include, exclude)
        space = ShardedTensorSpace([(n, t, by_name[n][1]) for n, t in chosen], **options)
        return space, shapes

    def _esbox(self) -> ParameterSpace:
        space = getattr(self, "esbox_space", None)
        if space is None:
            raise RuntimeError("esbox_init has not been called on this worker")
        return space

    @reported
    def esbox_begin_sweep(self) -> None:
        """Back up the weights and open a sweep (members then follow one RPC each)."""
        if getattr(self, "esbox_sweep_state", None) is not None:
            raise RuntimeError("a sweep is already open on this worker")
        feed = _Feed()
        manager = self._esbox().sweep(feed)  # type: ignore[arg-type]
        with torch.inference_mode():
            members = manager.__enter__()
        self.esbox_sweep_state = (manager, members, feed)

    @reported
    def esbox_member(self, perturbation: dict[str, Any]) -> None:
        """Hold the weights at the next member of the open sweep."""
        state = getattr(self, "esbox_sweep_state", None)
        if state is None:
            raise RuntimeError("no sweep is open on this worker")
        _, members, feed = state
        feed.pending.append(Perturbation(**perturbation))
        with torch.inference_mode():
            next(members)

    @reported
    def esbox_end_sweep(self) -> bool:
        """Restore the exact weights and close the sweep; False when none was open."""
        state = getattr(self, "esbox_sweep_state", None)
        if state is None:
            return False
        self.esbox_sweep_state = None
        with torch.inference_mode():
            state[0].__exit__(None, None, None)
        return True

    @reported
    def esbox_apply(self, update: dict[str, Any]) -> dict[str, Any]:
        """Apply an update by replay; returns the norm of the change and its square per
        tensor (what a tensor-parallel driver sums over the workers' distinct blocks)."""
        space = self._esbox()
        with torch.inference_mode():
            norm = space.apply(Update.from_dict(update))
        return {"norm": norm, "squares": space.update_squares}

    @reported
    def esbox_state_dict(self) -> bytes:
        """The space's state dict as safetensors bytes."""
        return pack_tensors(self._esbox().state_dict())

    @reported
    def esbox_load_state_dict(self, data: bytes) -> None:
        """Load a state dict (safetensors bytes) in place; a tensor-parallel worker takes its
        blocks of the logical tensors."""
        space = self._esbox()
        tensors = unpack_tensors(data)
        if isinstance(space, ShardedTensorSpace):
            tensors = shard_state(tensors, space.blocks)
        with torch.inference_mode():
            space.load_state_dict(tensors)

    @reported
    def esbox_tensors(self, names: list[str] | None = None) -> bytes:
        """The space's tensors as they are now (all, or those named), flat, as safetensors
        bytes."""
        space = self._esbox()
        wanted = set(names) if names is not None else None
        return pack_tensors(
            {
                n: t
                for n, t in zip(space.names, space._flat, strict=True)  # type: ignore[attr-defined]
                if wanted is None or n in wanted
            }
        )

    @reported
    def esbox_checksum(self, scope: str = "model") -> str:
        """sha256 of the raw bytes of every model parameter (``"model"``) or of the space's
        tensors (``"space"``)."""
        if scope == "space":
            return digest(self._esbox()._flat)
        model = self.get_model()  # type: ignore[attr-defined]
        return digest([p for _, p in model.named_parameters()])
