"""The tensors of a vLLM model as esbox sees them: logical (Hugging Face) or as vLLM holds them.

vLLM fuses some weights (``qkv_proj`` = q, k, v; ``gate_up_proj`` = gate, up) and pads the
vocabulary. With ``layout="hf"`` (the default) a space is laid out over the *logical* Hugging
Face tensors: contiguous row views of the fused tensors, the embedding without its padding
rows, in the order and with the names of the transformers model. The noise of a spec is then
the same as on a ``TorchModuleSpace`` of the transformers model, so a vLLM run and a
transformers run agree for the same seeds (bit for bit on the same device type, fp32).
``layout="vllm"`` defines the noise per vLLM tensor instead (fused, padded): valid for any
model vLLM loads, but its perturbations differ from a transformers run's.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import torch

from esbox.space import ParameterSpace

LAYOUTS = ("hf", "vllm")


def logical_tensors(model: torch.nn.Module, layout: str) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every trainable tensor of a vLLM model in ``layout``.

    ``"vllm"``: the model's parameters as they are. ``"hf"``: fused parameters split into
    contiguous row views named after their parts (``packed_modules_mapping``), vocabulary
    embeddings cut to the real vocabulary; views share storage with the vLLM weights.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    named = [(n, p.data) for n, p in model.named_parameters()]
    if layout == "vllm":
        return named
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    modules = dict(model.named_modules())
    out: list[tuple[str, torch.Tensor]] = []
    for name, data in named:
        owner, _, attr = name.rpartition(".")
        module = modules.get(owner)
        parent, _, leaf = owner.rpartition(".")
        sizes = getattr(module, "output_sizes", None)
        if leaf in packed and sizes is not None and attr in ("weight", "bias"):
            parts = packed[leaf]
            if len(parts) != len(sizes) or sum(sizes) != data.shape[0]:
                raise ValueError(
                    f"{name}: cannot split {tuple(data.shape)} into {parts} of sizes {sizes}"
                )
            start = 0
            for part, size in zip(parts, sizes, strict=True):
                out.append(
                    (
                        f"{parent}.{part}.{attr}" if parent else f"{part}.{attr}",
                        data[start : start + size],
                    )
                )
                start += size
        elif attr == "weight" and hasattr(module, "org_vocab_size") and data.ndim == 2:
            out.append((name, data[: module.org_vocab_size]))
        else:
            out.append((name, data))
    return out


def hf_parameter_shapes(hf_config: Any) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of the transformers model for ``hf_config``, in its order
    (built on the meta device: no memory, no weights)."""
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def order_like(
    tensors: list[tuple[str, torch.Tensor]], names: Sequence[str]
) -> list[tuple[str, torch.Tensor]]:
    """``tensors`` in the order of ``names``; both must name the same tensors."""
    by_name = dict(tensors)
    missing = [n for n in names if n not in by_name]
    extra = [n for n in by_name if n not in set(names)]
    if missing or extra:
        raise ValueError(
            "the vLLM model's logical tensors do not match the transformers model's "
            f"(missing in vLLM: {missing[:6]}, only in vLLM: {extra[:6]}); "
            "use layout='vllm' to define the noise per vLLM tensor"
        )
    return [(n, by_name[n]) for n in names]


def select(
    tensors: list[tuple[str, torch.Tensor]],
    include: Sequence[str] | None,
    exclude: Sequence[str],
) -> list[tuple[str, torch.Tensor]]:
    """The tensors whose name matches an ``include`` glob (all when None) and no ``exclude``."""
    chosen = [
        (name, t)
        for name, t in tensors
        if (include is None or any(fnmatch.fnmatchcase(name, p) for p in include))
        and not any(fnmatch.fnmatchcase(name, p) for p in exclude)
    ]
    if not chosen:
        names = ", ".join(n for n, _ in tensors[:8])
        raise ValueError(
            f"no tensor matches include={include} exclude={list(exclude)}; names look like: {names}"
        )
    return chosen


def check_not_repacked(named: list[tuple[str, torch.Tensor]]) -> None:
    for name, t in named:
        if t.numel() == 0:
            raise ValueError(
                f"tensor {name} is empty: vLLM repacked it after loading, so it cannot be "
                "edited in place (on CPU, esbox.adapters.generation.vllm_worker must be imported "
                "in the worker before the model loads: pass worker_extension_cls, or use make_llm)"
            )


class NamedTensorSpace(ParameterSpace):
    """A ParameterSpace over named tensors (views of a model's weights), edited in place."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], **options: Any) -> None:
        check_not_repacked(named)
        for name, t in named:
            if not t.is_contiguous() or not t.is_floating_point():
                raise ValueError(f"tensor {name} must be a contiguous float tensor")
        self.names = [n for n, _ in named]
        with torch.no_grad():
            super().__init__([t for _, t in named], **options)
