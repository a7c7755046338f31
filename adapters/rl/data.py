"""The GRPO training set of an esbox task: each train example's prompt as the exact text an ES
rollout feeds the model (chat template plus the task's prefill), and its index for the reward.

TRL tokenizes plain-text prompts itself, with the tokenizer's special tokens added; the text is
chosen so that its tokens equal what esbox's own backend encodes, or the build stops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from esbox.adapters.generation.backend import TemplatedPrompts
from esbox.adapters.tasks.base import Example
from esbox.errors import ConfigError

EXAMPLE_COLUMN = "example"  # index into task.train, handed to the reward by TRL


@dataclass
class TrainingInputs:
    """What TRL's trainer trains on: the dataset, the reward function, a ``rollout_func`` for
    multi-turn runs, esbox's held-out validation and the step's extra figures (agent runs)."""

    dataset: Any
    reward: Any
    validation: Any = None
    rollout_func: Any = None
    figures: Callable[[], dict[str, float]] | None = None


def validation_options(problem: dict[str, Any]) -> dict[str, Any]:
    """``HeldoutValidation``'s options from the problem section, as an ES run builds them."""
    return {
        "every": problem["validation_every"],
        "limit": problem["validation_limit"] or None,
        "num_samples": problem["validation_samples"],
    }


def single_turn(task: Any, backend: Any, problem: dict[str, Any]) -> TrainingInputs:
    """One completion a prompt, scored by the task's reward; validation as in ES runs."""
    from esbox.adapters.tasks.rollouts import HeldoutValidation

    from .reward import TaskReward

    validation = None
    if problem["validation_every"]:
        validation = HeldoutValidation(task, backend, **validation_options(problem))
    return TrainingInputs(task_dataset(backend, task.train), TaskReward(task), validation)


def trl_prompt(backend: TemplatedPrompts, example: Example) -> str:
    """The prompt text whose TRL tokenization is esbox's ``backend.encode`` of the example.

    A tokenizer that adds a BOS token while the chat template writes one too would double it:
    then the template's BOS is left out of the text (the tokenizer adds it back)."""
    tokenizer = backend.tokenizer
    text = backend.render(example.prompt, example.prefill)
    wanted = backend.encode(example.prompt, example.prefill)
    if _ids(tokenizer, text) == wanted:
        return text
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _ids(tokenizer, text[len(bos) :]) == wanted:
        return text[len(bos) :]
    raise ConfigError(
        f"the tokenizer of problem.model encodes the rendered prompt {text[:60]!r}... with "
        "different tokens when TRL tokenizes it than in ES rollouts; GRPO would train on other "
        "prompts than ES"
    )


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text=[text])["input_ids"][0])


def task_dataset(backend: TemplatedPrompts, examples: Sequence[Example]) -> Any:
    """A ``datasets.Dataset`` with a ``prompt`` column (text) and an ``example`` column."""
    import datasets

    return datasets.Dataset.from_dict(
        {
            "prompt": [trl_prompt(backend, e) for e in examples],
            EXAMPLE_COLUMN: list(range(len(examples))),
        }
    )
