"""RL baselines: GRPO (full and LoRA) through TRL's ``GRPOTrainer`` and peft, built from the
same run config as an ES run and writing the same run directory (the top room, beside
``problems``: may import every other room; none imports it). TRL and peft are imported inside
the functions that need them (the ``rl`` extra); ``training`` and ``rundir`` import
transformers, so they are imported by name where a run starts."""

from .keys import OWN_GRPO_KEYS, OWN_LORA_KEYS, check_grpo, check_lora
from .session import GRPORun, load_grpo_config, read_grpo_config

__all__ = [
    "OWN_GRPO_KEYS",
    "OWN_LORA_KEYS",
    "GRPORun",
    "check_grpo",
    "check_lora",
    "load_grpo_config",
    "read_grpo_config",
]
