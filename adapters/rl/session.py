"""A GRPO run from an esbox run config: the resolved config, TRL's ``GRPOConfig`` and
``GRPOTrainer`` over the ``problem:`` section's model, task, reward and held-out split.

The config is an ES run config plus a ``grpo:`` section (``trl.GRPOConfig`` keys) and an
optional ``lora:`` section (``peft.LoraConfig`` keys: LoRA-GRPO); ``strategy`` and ``options``
are the ES side's and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esbox.adapters.problems import resolve_config, resolve_model_path
from esbox.errors import ConfigError
from esbox.runconfig import RunConfig, to_dict

from .keys import check_grpo, check_lora, lora_config, require_trl

CHECKPOINTS = "checkpoints"
ES_ONLY = ("strategy", "options")  # the ES side of a shared config
NUM_GENERATIONS = 8  # TRL's default group size


@dataclass
class GRPORun:
    """A resolved GRPO run config: the ES config's sections, ``grpo`` and ``lora``."""

    config: RunConfig
    grpo: dict[str, Any]
    lora: dict[str, Any] | None

    @property
    def method(self) -> str:
        """``grpo`` (full parameters) or ``lora-grpo``: the run's "strategy"."""
        return "grpo" if self.lora is None else "lora-grpo"

    def to_dict(self) -> dict[str, Any]:
        """What ``config.yaml`` holds: re-reading it gives the same run."""
        data = {key: value for key, value in to_dict(self.config).items() if key not in ES_ONLY}
        data.pop("scale")
        return {"strategy": self.method, **data, "grpo": self.grpo, "lora": self.lora}


def load_grpo_config(raw: dict[str, Any]) -> GRPORun:
    """Check a raw config for a GRPO run; ConfigError names a bad key."""
    raw = {key: value for key, value in raw.items() if key not in ES_ONLY}
    grpo, lora = check_grpo(raw.pop("grpo", None)), check_lora(raw.pop("lora", None))
    budget = dict(raw.get("budget") or {})
    if budget.get("max_evaluations") is not None:
        raise ConfigError(
            "budget.max_evaluations counts ES members; a GRPO run stops at budget.max_steps "
            "(optimizer steps) or budget.max_seconds: set budget.max_evaluations: null"
        )
    raw["budget"] = {**budget, "max_evaluations": None}
    config = resolve_config(raw)
    problem = config.problem
    if problem["kind"] != "llm":
        raise ConfigError(
            f"esbox grpo trains an LLM: problem.kind must be llm, not {problem['kind']}"
        )
    if problem["backend"] != "transformers":
        raise ConfigError(
            "problem.backend: a GRPO run generates with transformers in the trainer's process "
            "(TRL's own vLLM generation is grpo.use_vllm)"
        )
    if config.scale.workers:
        raise ConfigError("scale.workers: a GRPO run trains in one process (scale.workers: 0)")
    if config.tracking.tensorboard or config.tracking.wandb:
        raise ConfigError("tracking: a GRPO run writes metrics.jsonl only (tracking: {})")
    _batch(problem, grpo)  # a batch that does not split is refused before anything loads
    problem_task(problem)
    return GRPORun(config, grpo, lora)


def problem_task(problem: dict[str, Any]) -> Any:
    """The task of ``problem.task`` (bad options: ConfigError, as in an ES run)."""
    from esbox.adapters.tasks.loading import load_task

    try:
        return load_task(problem["task"])
    except ValueError as exc:
        raise ConfigError(f"problem: {exc}") from None


def read_grpo_config(raw: dict[str, Any]) -> GRPORun:
    """The GRPO run of a ``config.yaml`` that :meth:`GRPORun.to_dict` wrote."""
    return load_grpo_config({k: v for k, v in raw.items() if k != "lora" or v is not None})


def _batch(problem: dict[str, Any], grpo: dict[str, Any]) -> int:
    """Completions per device and micro-batch: ``problem.batch_size`` prompts per optimizer step,
    ``num_generations`` completions each, over ``gradient_accumulation_steps`` micro-batches."""
    completions = problem["batch_size"] * grpo.get("num_generations", NUM_GENERATIONS)
    accumulation = grpo.get("gradient_accumulation_steps", 1)
    if not isinstance(accumulation, int) or accumulation < 1 or completions % accumulation:
        raise ConfigError(
            f"grpo.gradient_accumulation_steps ({accumulation}) must divide problem.batch_size x "
            f"num_generations ({completions} completions a step)"
        )
    return completions // accumulation


def trainer_arguments(run: GRPORun, directory: Path, task: Any) -> Any:
    """TRL's ``GRPOConfig``: the ``grpo:`` section, and what esbox sets from the rest."""
    trl = require_trl()
    config, problem = run.config, run.config.problem
    every = config.checkpoint.every
    own = {
        "output_dir": str(directory / CHECKPOINTS),
        "seed": config.seed,
        "data_seed": config.seed,
        "max_steps": config.budget.max_steps or -1,
        "per_device_train_batch_size": _batch(problem, run.grpo),
        "max_completion_length": problem["max_new_tokens"] or task.max_new_tokens,
        "bf16": False,  # TRL's default, True, needs bf16 autocast support; weights keep dtype
        "fp16": False,
        "use_cpu": problem["device"] == "cpu",
        "logging_strategy": "steps",
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,  # esbox's own bar (or none with --quiet)
        "save_strategy": "steps" if every else "no",
        "save_steps": every or 1,
        "save_total_limit": config.checkpoint.keep,
        "eval_strategy": "no",
    }
    try:
        return trl.GRPOConfig(**run.grpo, **own)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"grpo: {exc}") from None


@dataclass
class GRPOParts:
    """What a GRPO run trains: the trainer, and the pieces esbox keeps beside it."""

    trainer: Any
    tokenizer: Any
    task: Any
    reward: Any
    validation: Any
    label: str
    trainable: int


def build_trainer(run: GRPORun, directory: Path) -> GRPOParts:
    """Load the model and task of ``problem:`` and build TRL's trainer over them."""
    import torch

    from esbox.adapters.generation.hf import HFBackend
    from esbox.adapters.models.loading import load_model
    from esbox.adapters.models.space import select_parameters
    from esbox.adapters.tasks.rollouts import HeldoutValidation

    from .data import task_dataset
    from .reward import TaskReward

    trl = require_trl()
    problem = run.config.problem
    task = problem_task(problem)
    args = trainer_arguments(run, directory, task)
    if problem["threads"]:
        torch.set_num_threads(problem["threads"])
    model, tokenizer = load_model(
        resolve_model_path(problem["model"]), dtype=problem["dtype"], device=problem["device"]
    )
    tokenizer.padding_side = "left"  # TRL's requirement; esbox's backend pads by itself
    if run.lora is None:
        for _, parameter in select_parameters(
            model, problem["include"] or None, problem["exclude"]
        ):
            parameter.requires_grad_(True)
    reward = TaskReward(task)
    dataset = task_dataset(HFBackend(model, tokenizer), task.train)
    try:
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(run.lora) if run.lora is not None else None,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"grpo: {exc}") from None
    validation = None
    if problem["validation_every"]:
        validation = HeldoutValidation(
            task, HFBackend(trainer.model, tokenizer), every=problem["validation_every"],
            limit=problem["validation_limit"] or None, num_samples=problem["validation_samples"],
        )  # fmt: skip
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    label = f"{Path(str(problem['model'])).name} on {problem['task'].get('kind', 'task')}"
    return GRPOParts(trainer, tokenizer, task, reward, validation, label, trainable)


def save_model(parts: GRPOParts, directory: Path, lora: bool) -> dict[str, Any]:
    """The trained model as a transformers folder (safetensors) in ``model/``; LoRA-GRPO also
    keeps its adapter in ``adapter/`` and merges it into the saved model."""
    model, out = parts.trainer.model, Path(directory) / "model"
    saved: dict[str, Any] = {"model": str(out)}
    if lora:
        model.save_pretrained(directory / "adapter", safe_serialization=True)
        saved["adapter"] = str(directory / "adapter")
        model = model.merge_and_unload()
    model.save_pretrained(out, safe_serialization=True)
    parts.tokenizer.save_pretrained(out)
    return saved
