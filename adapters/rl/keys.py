"""The ``grpo:`` and ``lora:`` sections of a run config: keys of ``trl.GRPOConfig`` and of
``peft.LoraConfig``, checked against those dataclasses, minus the keys esbox sets itself."""

from __future__ import annotations

import dataclasses
from typing import Any

from esbox.errors import ConfigError, check_foreign_keys

_LOGS = "esbox logs every step to metrics.jsonl"
_EVAL = "esbox scores the held-out split itself: problem.validation_every, validation_limit"
# GRPOConfig fields that come from the rest of the run config, or that esbox's run directory
# needs as they are
OWN_GRPO_KEYS: dict[str, str] = {
    "output_dir": "the run directory, --out or output.dir",
    "overwrite_output_dir": "the run directory, --out or output.dir",
    "seed": "the config's seed",
    "data_seed": "the config's seed",
    "max_steps": "budget.max_steps",
    "per_device_train_batch_size": "problem.batch_size x num_generations, split over "
    "gradient_accumulation_steps",
    "max_completion_length": "problem.max_new_tokens, or the task's default",
    "model_init_kwargs": "esbox loads the model from problem.model in problem.dtype",
    "bf16": "problem.dtype: the weights train in that dtype, no mixed precision",
    "fp16": "problem.dtype: the weights train in that dtype, no mixed precision",
    "use_cpu": "problem.device",
    "chat_template_kwargs": "esbox renders the prompts with the model's chat template and the "
    "task's prefill, as ES rollouts see them",
    "logging_strategy": _LOGS,
    "logging_steps": _LOGS,
    "logging_first_step": _LOGS,
    "report_to": _LOGS,
    "disable_tqdm": "--quiet",
    "save_strategy": "checkpoint.every",
    "save_steps": "checkpoint.every",
    "save_total_limit": "checkpoint.keep",
    "resume_from_checkpoint": "esbox resume RUN_DIR",
    "eval_strategy": _EVAL,
    "eval_steps": _EVAL,
    "do_eval": _EVAL,
    "eval_on_start": _EVAL,
    "push_to_hub": "the trained model is saved in RUN_DIR/model",
}
OWN_LORA_KEYS: dict[str, str] = {
    "task_type": "always CAUSAL_LM",
    "peft_type": "always LORA",
    "inference_mode": "the adapter trains",
    "base_model_name_or_path": "problem.model",
}


def require_trl() -> Any:
    """The ``trl`` module, or a ConfigError naming the extra to install."""
    try:
        import trl
    except ImportError:
        raise ConfigError("esbox grpo needs TRL and peft: pip install 'esbox[rl]'") from None
    return trl


def _mapping(section: Any, name: str) -> dict[str, Any]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(f"config key '{name}' must be a mapping, got {section!r:.80}")
    return dict(section)


def check_grpo(section: Any) -> dict[str, Any]:
    """The ``grpo:`` section as given, after checking every key against ``trl.GRPOConfig``."""
    values = _mapping(section, "grpo")
    trl = require_trl()
    allowed = (f.name for f in dataclasses.fields(trl.GRPOConfig))
    check_foreign_keys(
        values, "grpo", own=OWN_GRPO_KEYS, allowed=allowed, what="field of trl.GRPOConfig"
    )
    return values


def grpo_default(name: str) -> Any:
    """The default of ``trl.GRPOConfig``'s field ``name`` (e.g. ``num_generations``)."""
    field = next(f for f in dataclasses.fields(require_trl().GRPOConfig) if f.name == name)
    return field.default


def check_lora(section: Any) -> dict[str, Any] | None:
    """The ``lora:`` section (None: full-parameter GRPO), checked against ``peft.LoraConfig``."""
    if section is None:
        return None
    values = _mapping(section, "lora")
    try:
        import peft
    except ImportError:
        raise ConfigError("a lora: section needs peft: pip install 'esbox[rl]'") from None
    allowed = (f.name for f in dataclasses.fields(peft.LoraConfig))
    check_foreign_keys(
        values, "lora", own=OWN_LORA_KEYS, allowed=allowed, what="field of peft.LoraConfig"
    )
    return values


def lora_config(values: dict[str, Any]) -> Any:
    """The ``peft.LoraConfig`` of a checked ``lora:`` section (bad values: ConfigError)."""
    import peft

    try:
        return peft.LoraConfig(**values, task_type="CAUSAL_LM")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"lora: {exc}") from None
