"""Theoretical memory of one training step: ES (esbox) vs full-parameter GRPO vs LoRA-GRPO.

Everything is computed from a transformers config (a local model folder, a ``config.json`` or a
``PretrainedConfig``; see ``model_shapes``): nothing is downloaded and no weight is allocated.
The formulas, their sources and assumptions are in ``docs/memory.md``;
``esbox memory --model PATH --context 128k`` prints the table. How the three grow with an agent
trajectory's length is in ``trajectory_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from esbox.noise import DEFAULT_TABLE_SIZE, NOISE_MODES
from esbox.partition import label_dtype, pattern_length

from .shapes import (
    LORA_TARGETS,
    ModelShape,
    canonical_dtype,
    dtype_bytes,
    model_shape,
    parse_context,
)
from .space import MODEL_CHUNK_SIZE

ATTENTION = ("flash", "eager")
ES, GRPO, LORA = "es", "grpo", "lora"  # MemoryEstimate.method keys


def format_bytes(n: float) -> str:
    """``1.23 GiB``-style size (binary units)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{n:.0f} B"


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
    chunk_size: int = MODEL_CHUNK_SIZE,
    subspaces: int = 1,
    noise: str = "generator",
    table_size: int = DEFAULT_TABLE_SIZE,
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
    checkpointing for GRPO. ``chunk_size``, ``subspaces`` (CoPES K), ``noise``
    and ``table_size`` are the ES space's settings (weights on an accelerator).
    ``config_or_path`` may also be a ``ModelShape`` already read (its LoRA targets then
    stand). See docs/memory.md for every formula.
    """
    s, b, w = parse_context(context), int(batch), dtype_bytes(dtype)
    if min(b, lora_rank, subspaces, chunk_size) < 1:
        raise ValueError("batch, lora_rank, subspaces and chunk_size must all be >= 1")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    if noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
    if es_optimizer not in ("sgd", "adam"):
        raise ValueError(f"es_optimizer must be 'sgd' or 'adam', got {es_optimizer!r}")
    if backup_device not in ("cpu", "device"):
        raise ValueError(f"backup_device must be 'cpu' or 'device', got {backup_device!r}")
    shape = (
        config_or_path
        if isinstance(config_or_path, ModelShape)
        else model_shape(config_or_path, lora_targets=lora_targets)
    )
    c = min(chunk_size, shape.largest_tensor)
    if noise == "table" and c > table_size:
        raise ValueError(f"chunk_size {c} exceeds the noise table ({table_size})")
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
    es_items = [
        weights,
        kv,
        Item(
            "prefill workspace (transient)",
            b * sp * (4 * h + 3 * i_dim) * w + scores + 4 * b * V,
            "b * s_p * (4h + 3i) * bytes + 4 * b * V (last-token logits, fp32)"
            + (" + 2 * b * a * s_p * s * bytes (eager scores)" if scores else ""),
        ),
        *_es_space_items(c, w, subspaces, noise, table_size),
    ]
    if es_optimizer == "adam":  # moments in the update's precision: fp64 for fp64 weights
        m = 8 if w == 8 else 4
        es_items.append(Item("Adam moments", 2 * m * P, f"2 * {m} * d (fp{8 * m} m and v)"))
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
        "noise": noise,
    }
    return MemoryEstimate(shape, s, b, canonical_dtype(dtype), settings, methods, tuple(notes))


def _es_space_items(c: int, w: int, subspaces: int, noise: str, table_size: int) -> list[Item]:
    """What the ES parameter space holds on the accelerator beside the weights.

    ``c`` is the largest chunk and ``w`` the bytes of a weight. The terms follow
    ``ParameterSpace`` (esbox/space.py): see docs/memory.md for each buffer.
    """
    acc = 8 if w == 8 else 4  # the update accumulates in fp64 for fp64 weights, else fp32
    masked = subspaces > 1
    buffers = [(4, "noise (one fp32 chunk buffer on an accelerator)")] if noise != "table" else []
    buffers.append(
        (2 * acc, f"update accumulators (fp{8 * acc} gradient estimate and subspace sum, reused)")
    )
    if acc == 4:
        buffers.append((8, "fp64 copy of the step for its norm"))
    else:
        buffers.append((8, "fp64 copy of each noise chunk"))
    items = [
        Item(
            "ES chunk buffers",
            sum(n for n, _ in buffers) * c,
            " + ".join(f"{n}c {what}" for n, what in buffers)
            + ", c = min(chunk_size, largest tensor)",
        )
    ]
    if noise == "table":
        items.append(
            Item(
                "noise table",
                4 * table_size,
                f"4 * {table_size:,} (fp32 noise table, one per device)",
            )
        )
    if masked:
        size = label_dtype(subspaces).itemsize
        pattern = 2 * pattern_length(subspaces, c)
        items.append(
            Item(
                "partition pattern (CoPES)",
                pattern * size,
                f"2 * {pattern // 2:,} * {size} (the step's label pattern, c rounded up to "
                f"whole blocks of K = {subspaces}, written twice, {size} byte(s) a label)",
            )
        )
        items.append(
            Item(
                "subspace mask (CoPES)",
                4 * pattern,
                f"4 * 2 * {pattern // 2:,} (one subspace's fp32 0/1 mask over the whole "
                "pattern: every chunk's mask is a view of it)",
            )
        )
    return items
