"""SDPA attention that hands grouped-query keys and values to the kernel as they are.

With a padding mask, transformers' ``sdpa`` attention copies every layer's keys and values
``heads / kv_heads`` times (``repeat_kv``) before calling the kernel, because CUDA's fused
kernels need it. torch's CPU kernels take ``enable_gqa=True`` with a mask and give the same
numbers bit for bit, so on a CPU those copies (a fresh batch x heads x length tensor per layer
and token) are pure allocation churn. ``use_gqa_attention(model)`` switches a CPU model to this
attention; everything else (masks, causality, scaling) is transformers' ``sdpa``.
"""

from __future__ import annotations

from typing import Any

from esbox.adapters.models.loading import require_transformers

NAME = "esbox_gqa_sdpa"


def gqa_sdpa_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function signature; GQA through the kernel, never copied."""
    import torch

    if kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(query.shape[2] > 1 and attention_mask is None and is_causal)
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return output.transpose(1, 2).contiguous(), None


def use_gqa_attention(model: Any) -> bool:
    """Switch ``model`` from ``sdpa`` to this attention where it runs on a CPU with fewer key
    and value heads than query heads; True if it did."""
    transformers = require_transformers()
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if config is not None else None
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    try:
        device = next(model.parameters()).device.type
    except StopIteration:
        return False
    if device != "cpu" or not heads or kv_heads == heads:
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    transformers.AttentionInterface.register(NAME, gqa_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
