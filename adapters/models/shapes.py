"""Model shapes from a transformers config: sizes, exact parameter counts, LoRA targets.

What the memory estimate (``esbox.adapters.models.memory``) needs from a model, read from a local
folder, a ``config.json``, a dict or a ``PretrainedConfig``: nothing is downloaded and no weight
is allocated (parameters are counted on the ``meta`` device). Also the parsing of the
estimate's inputs: context lengths (``"128k"``) and dtypes (``"bf16"``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .loading import require_transformers

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16"}
_DTYPE_ALIASES |= {"fp16": "float16", "half": "float16", "fp64": "float64"}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20}
_CONTEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([km]?)\s*$", re.IGNORECASE)


def parse_context(value: str | int) -> int:
    """Token count from ``4096``, ``"4096"``, ``"128k"`` (131072) or ``"1m"`` (1048576)."""
    if isinstance(value, int) and not isinstance(value, bool):
        tokens = value
    else:
        match = _CONTEXT.match(str(value).replace("_", ""))
        number = float(match[1]) * _SUFFIX[match[2].lower()] if match else -1.0
        if not number.is_integer():
            raise ValueError(f"context {value!r} is not a whole number of tokens")
        tokens = int(number)
    if tokens < 1:
        raise ValueError(
            f"context must be a positive token count such as 4096, 32k, 128k or 1m; got {value!r}"
        )
    return tokens


def canonical_dtype(dtype: Any) -> str:
    """``"bfloat16"`` from ``"bf16"``, ``torch.bfloat16``, ... (unknown names pass through)."""
    name = str(dtype).lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of ``"bf16"``, ``"float32"``, ``torch.float16``, ..."""
    name = canonical_dtype(dtype)
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


@dataclass(frozen=True)
class ModelShape:
    """What the formulas need from a config: sizes, exact parameter count, LoRA targets."""

    name: str
    parameters: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    largest_tensor: int
    lora_matrices: tuple[tuple[int, int], ...]  # (in_features, out_features) of each target
    windows: tuple[int | None, ...]  # per layer: sliding-window length, None for full attention
    max_context: int | None = None
    counted: str = "meta"  # "meta" (exact) or "closed-form"

    def lora_parameters(self, rank: int) -> int:
        """``r * (in + out)`` summed over the targeted linear layers."""
        return rank * sum(i + o for i, o in self.lora_matrices)

    def attended(self, context: int) -> list[int]:
        """Keys each layer attends to (and caches) at ``context`` tokens."""
        return [context if w is None else min(context, w) for w in self.windows]


def load_config(config_or_path: Any) -> Any:
    """A ``PretrainedConfig`` from itself, a dict, a local folder or ``config.json``."""
    transformers = require_transformers()
    if isinstance(config_or_path, transformers.PretrainedConfig):
        return config_or_path
    if isinstance(config_or_path, dict):
        data = dict(config_or_path)
        return transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    path = Path(str(config_or_path)).expanduser()
    if path.is_file():
        return load_config(json.loads(path.read_text(encoding="utf-8")))
    if (path / "config.json").is_file():
        return transformers.AutoConfig.from_pretrained(str(path))
    try:  # a hub name already in the local cache; never a download
        return transformers.AutoConfig.from_pretrained(str(config_or_path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"no config.json found for {config_or_path!r}: pass a local model folder, a "
            "config.json or a transformers config object (nothing is downloaded)"
        ) from exc


def model_shape(config_or_path: Any, *, lora_targets: tuple[str, ...] = LORA_TARGETS) -> ModelShape:
    """Sizes of a decoder-only LM; parameters counted on the ``meta`` device when possible."""
    config = load_config(config_or_path)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    hidden = text.hidden_size
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    layers = text.num_hidden_layers
    kinds = getattr(text, "layer_types", None) or ["full_attention"] * layers
    window = getattr(text, "sliding_window", None)
    windows = tuple(window if k == "sliding_attention" and window else None for k in kinds)
    dims = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": getattr(text, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "intermediate": getattr(text, "intermediate_size", None) or 4 * hidden,
        "vocab": text.vocab_size,
        "windows": windows,
        "max_context": getattr(text, "max_position_embeddings", None),
    }
    name = str(getattr(config, "name_or_path", "") or getattr(config, "model_type", "model"))
    name = name.rstrip("/").rsplit("/", 1)[-1]
    try:
        counts = _count_on_meta(config, lora_targets)
    except Exception:  # an architecture AutoModelForCausalLM cannot build: closed form
        counts = _count_closed_form(text, dims, lora_targets)
    return ModelShape(name=name, **dims, **counts)


def _count_on_meta(config: Any, targets: tuple[str, ...]) -> dict[str, Any]:
    """Exact counts from the model built on the meta device (no memory allocated)."""
    import torch

    transformers = require_transformers()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    params = list(model.parameters())  # a tied tensor is listed once
    lora = tuple(
        (m.in_features, m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in targets
    )
    return {
        "parameters": sum(p.numel() for p in params),
        "largest_tensor": max(p.numel() for p in params),
        "lora_matrices": lora,
        "counted": "meta",
    }


def _count_closed_form(text: Any, d: dict[str, Any], targets: tuple[str, ...]) -> dict[str, Any]:
    """Llama-style closed form (embeddings, GQA attention, gated MLP, RMSNorms)."""
    h, q, kv, i, v = (
        d["hidden"],
        d["heads"] * d["head_dim"],
        d["kv_heads"] * d["head_dim"],
        d["intermediate"],
        d["vocab"],
    )
    shapes = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    bias = (q + 2 * kv) if getattr(text, "attention_bias", False) else 0
    per_layer = sum(a * b for a, b in shapes.values()) + bias + 2 * h
    tied = getattr(text, "tie_word_embeddings", True)
    total = v * h * (1 if tied else 2) + d["layers"] * per_layer + h
    lora = tuple(s for _ in range(d["layers"]) for n, s in shapes.items() if n in targets)
    return {
        "parameters": total,
        "largest_tensor": max(v * h, h * i),
        "lora_matrices": lora,
        "counted": "closed-form",
    }
