"""Theoretical memory of one training step: ES (esbox) vs full-parameter GRPO vs LoRA-GRPO.

Everything is computed from a transformers config (a local model folder, a ``config.json`` or a
``PretrainedConfig``): nothing is downloaded and no weight is allocated. Parameters are counted
exactly on the ``meta`` device. The formulas, their sources and assumptions are in
``docs/memory.md``; ``esbox memory --model PATH --context 128k`` prints the table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .models import require_transformers

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16"}
_DTYPE_ALIASES |= {"fp16": "float16", "half": "float16", "fp64": "float64"}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION = ("flash", "eager")
ES, GRPO, LORA = "es", "grpo", "lora"  # MemoryEstimate.method keys
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


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of ``"bf16"``, ``"float32"``, ``torch.float16``, ..."""
    name = str(dtype).lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def format_bytes(n: float) -> str:
    """``1.23 GiB``-style size (binary units)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{n:.0f} B"


# --------------------------------------------------------------------------- model shape


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


# --------------------------------------------------------------------------- estimate


@dataclass(frozen=True)
class Item:
    """One memory component: its size, the formula that gave it, and where it lives."""

    name: str
    bytes: int
    formula: str
    host: bool = False


@dataclass(frozen=True)
class MethodMemory:
    """The components of one method's training step (``key`` is es, grpo or lora)."""

    key: str
    name: str
    items: tuple[Item, ...]

    @property
    def device_bytes(self) -> int:
        return sum(i.bytes for i in self.items if not i.host)

    @property
    def host_bytes(self) -> int:
        return sum(i.bytes for i in self.items if i.host)

    def get(self, name: str) -> int:
        """Bytes of component ``name`` (0 when the method does not have it)."""
        return sum(i.bytes for i in self.items if i.name == name)


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory of one step of each method at one context, batch and dtype."""

    model: ModelShape
    context: int
    batch: int
    dtype: str
    settings: dict[str, Any]
    methods: tuple[MethodMemory, ...]
    notes: tuple[str, ...] = field(default=())

    def method(self, key: str) -> MethodMemory:
        """The method with key ``es``, ``grpo`` or ``lora`` (or its display name)."""
        for m in self.methods:
            if key in (m.key, m.name):
                return m
        raise KeyError(f"no method {key!r}; have {[m.key for m in self.methods]}")

    def table(self, formulas: bool = False) -> str:
        """Markdown: a header, one column per method, device and host totals, ratios."""
        m = self.model
        lines = [
            f"**{m.name}**: {m.parameters:,} parameters ({m.counted} count), {m.layers} layers, "
            f"hidden {m.hidden}, {m.heads}/{m.kv_heads} query/KV heads x {m.head_dim}, "
            f"vocab {m.vocab:,}",
            "",
            f"context {self.context:,} tokens, batch {self.batch}, {self.dtype}, "
            + ", ".join(f"{k} {v}" for k, v in self.settings.items()),
            "",
            "| component | " + " | ".join(x.name for x in self.methods) + " |",
            "|---|" + "---:|" * len(self.methods),
        ]
        names = list(dict.fromkeys(i.name for x in self.methods for i in x.items if not i.host))
        for name in names:
            cells = [format_bytes(x.get(name)) if x.get(name) else "-" for x in self.methods]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        es = self.methods[0].device_bytes
        rows = [
            ("**device total**", [f"**{format_bytes(x.device_bytes)}**" for x in self.methods]),
            (
                "host (exact backup / fp32 master)",
                [format_bytes(x.host_bytes) for x in self.methods],
            ),
            (
                "device total / ES device total",
                [f"{x.device_bytes / es:.2f}x" for x in self.methods],
            ),
        ]
        lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
        lines += [f"\n> {note}" for note in self.notes]
        if formulas:
            lines.append("")
            for x in self.methods:
                lines.append(f"*{x.name}*")
                host = " (host)"
                lines += [f"- {i.name}{host if i.host else ''}: `{i.formula}`" for i in x.items]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "parameters": self.model.parameters,
            "context": self.context,
            "batch": self.batch,
            "dtype": self.dtype,
            **self.settings,
            "methods": {
                x.key: {
                    "name": x.name,
                    "device_bytes": x.device_bytes,
                    "host_bytes": x.host_bytes,
                    "items": {i.name: i.bytes for i in x.items},
                }
                for x in self.methods
            },
        }


def estimate_memory(
    config_or_path: Any,
    *,
    context: int | str,
    batch: int = 1,
    dtype: Any = "bfloat16",
    lora_rank: int = 16,
    chunk_size: int = 2**22,
    subspaces: int = 1,
    attention: str = "flash",
    recompute: bool = False,
    prefill_chunk: int | None = None,
    kl_reference: bool = True,
    es_optimizer: str = "sgd",
    backup_device: str = "cpu",
    lora_targets: tuple[str, ...] = LORA_TARGETS,
) -> MemoryEstimate:
    """Theoretical memory of one step of ES, full-parameter GRPO and LoRA-GRPO.

    ``context`` is the full sequence length (prompt + completion) of a rollout, ``batch`` the
    number of sequences decoded (and, for GRPO, back-propagated) together. ``attention`` is
    ``"flash"`` (no s^2 term) or ``"eager"``; ``recompute`` turns on full activation
    checkpointing for GRPO. See docs/memory.md for every formula.
    """
    s, b, w = parse_context(context), int(batch), dtype_bytes(dtype)
    dtype_name = _canonical(dtype)
    if b < 1 or lora_rank < 1 or subspaces < 1 or chunk_size < 1:
        raise ValueError("batch, lora_rank, subspaces and chunk_size must all be >= 1")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    if es_optimizer not in ("sgd", "adam"):
        raise ValueError(f"es_optimizer must be 'sgd' or 'adam', got {es_optimizer!r}")
    if backup_device not in ("cpu", "device"):
        raise ValueError(f"backup_device must be 'cpu' or 'device', got {backup_device!r}")
    shape = model_shape(config_or_path, lora_targets=lora_targets)
    P, L, h, a, V = shape.parameters, shape.layers, shape.hidden, shape.heads, shape.vocab
    kv_dim, i_dim = shape.kv_heads * shape.head_dim, shape.intermediate
    keys = shape.attended(s)
    act = w / 2  # the published activation constants assume 16-bit activations

    kv = Item(
        "KV cache (rollout)",
        2 * b * kv_dim * w * sum(keys),
        "2 * b * s * L * n_kv * head_dim * bytes  (s capped at the window on sliding layers)",
    )
    weights = Item("weights", P * w, "P * bytes")

    # -- ES: forward passes only
    sp = min(s, prefill_chunk or s)
    scores = 2 * b * a * sp * max(keys) * w if attention == "eager" else 0
    c = min(chunk_size, shape.largest_tensor)
    es_items = [
        weights,
        kv,
        Item(
            "prefill workspace (transient)",
            b * sp * (4 * h + 3 * i_dim) * w + scores + 4 * b * V,
            "b * s_p * (4h + 3i) * bytes + 4 * b * V (last-token logits, fp32)"
            + (" + 2 * b * a * s_p * s * bytes (eager scores)" if scores else ""),
        ),
        Item(
            "ES chunk buffers",
            28 * c + (26 * c if subspaces > 1 else 0),
            "28 * c (fp32 noise, accumulator, step; fp64 step and its square for the norm)"
            + (" + 26 * c (int64 label draw, uint8 labels, bool mask)" if subspaces > 1 else "")
            + ", c = min(chunk_size, largest tensor)",
        ),
    ]
    if subspaces > 1:
        label = 1 if subspaces <= 256 else 4
        es_items.append(
            Item("partition labels (CoPES)", label * P, f"d * {label} byte (label cache, K > 1)")
        )
    if es_optimizer == "adam":
        es_items.append(Item("Adam moments", 8 * P, "2 * 4 * d (fp32 m and v)"))
    low = w < 4
    es_items.append(
        Item(
            "exact backup / fp32 master",
            (4 if low else w) * P,
            "4 * d (fp32 master of 16-bit weights)" if low else "d * bytes (exact backup)",
            host=backup_device == "cpu",
        )
    )

    # -- backprop activations: Korthikanti et al. 2022, per layer, 16-bit activations
    per_layer = [34 * s * b * h + (5 * a * s * k * b if attention == "eager" else 0) for k in keys]
    if recompute:
        stored = int(act * (2 * s * b * h * L + max(per_layer)))
        act_formula = "2 * s * b * h * L + one layer's s*b*h*(34 [+ 5as/h]) (full recompute)"
    else:
        stored = int(act * sum(per_layer))
        act_formula = "L * s * b * h * 34" + (" + L * 5 * a * s^2 * b" if scores else "")
    act_formula += "  (x bytes/2; Korthikanti et al. 2022)"
    activations = Item("activations (backprop)", stored, act_formula)
    logits = Item("logits (loss)", 4 * s * b * V, "4 * s * b * V (fp32 logits for the loss)")

    grpo_items = [
        weights,
        Item("gradients", P * w, "P * bytes"),
        Item("fp32 master weights", 4 * P if low else 0, "4 * P (16-bit weights only)"),
        Item("Adam moments", 8 * P, "2 * 4 * P (fp32 m and v)"),
        activations,
        logits,
        kv,
    ]
    if kl_reference:
        grpo_items.append(Item("reference model (KL)", P * w, "P * bytes (frozen copy)"))
    n_lora = shape.lora_parameters(lora_rank)
    lora_items = [
        Item("weights", P * w, "P * bytes (frozen)"),
        Item(
            "LoRA params + grads + Adam",
            16 * n_lora,
            f"16 * r * sum(in + out) = 16 * {n_lora:,} (fp32 param, grad, m, v)",
        ),
        activations,
        logits,
        kv,
    ]
    es_name = "ES (esbox)" if subspaces == 1 else f"ES (esbox, CoPES K={subspaces})"
    methods = (
        MethodMemory(ES, es_name, tuple(x for x in es_items if x.bytes)),
        MethodMemory(GRPO, "GRPO (full)", tuple(x for x in grpo_items if x.bytes)),
        MethodMemory(LORA, f"LoRA-GRPO (r={lora_rank})", tuple(lora_items)),
    )
    notes = []
    if shape.max_context and s > shape.max_context:
        notes.append(
            f"context {s:,} exceeds the model's max_position_embeddings ({shape.max_context:,})"
        )
    settings = {
        "attention": attention,
        "recompute": recompute,
        "LoRA rank": lora_rank,
        "subspaces": subspaces,
        "chunk": c,
    }
    return MemoryEstimate(shape, s, b, dtype_name, settings, methods, tuple(notes))


def _canonical(dtype: Any) -> str:
    name = str(dtype).lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)
