"""reasoning-gym's procedural datasets as a task: ``name``, ``size``, ``seed`` and the dataset's
own ``config``; each answer is scored by that dataset's ``score_answer`` (partial credit where
it gives some), on the text of the last ``<answer>`` (else the whole completion).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from esbox.errors import ConfigError, unknown_key_message

from .base import Example, Task, make_prompt
from .tool_math import last_answer

INSTALL = "reasoning_gym tasks need the reasoning-gym package: pip install 'esbox[environments]'"
INSTRUCTION = "\n\nPut your final answer inside <answer></answer> tags."


def dataset_names() -> list[str]:
    """Every dataset name reasoning-gym registers (``esbox tasks reasoning_gym`` prints them)."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        raise ConfigError(f"problem.task: {INSTALL}") from exc  # exit 2, not a traceback
    return sorted(DATASETS)


def make_dataset(name: Any, size: int, seed: int, config: dict[str, Any]) -> Any:
    """``reasoning_gym.create_dataset``; ConfigError names an unknown name, option or value."""
    names = dataset_names()
    if name not in names:
        raise ConfigError(f"problem.task.name: {unknown_key_message('dataset', str(name), names)}")
    from reasoning_gym import create_dataset
    from reasoning_gym.factory import DATASETS

    fields = {f.name for f in dataclasses.fields(DATASETS[name][1])} - {"size", "seed"}
    for key in config:
        if key not in fields:
            raise ConfigError(
                f"problem.task.config: {unknown_key_message(f'{name} option', key, fields)}"
            )
    try:
        return create_dataset(name, size=size, seed=seed, **config)
    except (AssertionError, ValueError, TypeError) as exc:
        raise ConfigError(f"problem.task.config: {name} refuses {config}: {exc}") from None


class ReasoningGymTask(Task):
    """The first ``heldout_size`` questions of a seeded reasoning-gym dataset are held out, the
    next ``size`` train; ``score`` is the dataset's own ``score_answer``."""

    max_new_tokens = 256

    def __init__(
        self,
        *,
        name: str,
        size: int = 1000,
        heldout_size: int = 100,
        seed: int = 0,
        config: dict[str, Any] | None = None,
        chat: bool = True,
        system: str | None = None,
        instruction: str = INSTRUCTION,
    ) -> None:
        if size < 1 or heldout_size < 0:
            raise ConfigError(f"problem.task.size must be >= 1 and heldout_size >= 0, got "
                              f"{size} and {heldout_size}")  # fmt: skip
        self.dataset = make_dataset(name, size + heldout_size, seed, dict(config or {}))
        self.entries = list(self.dataset)  # generated once: score_answer reads the entry
        self.name = f"reasoning_gym/{name}"
        examples = [
            Example(
                make_prompt(f"{entry['question']}{instruction}", chat=chat, system=system),
                str(entry["answer"]),
                None,
                {"index": i},
            )
            for i, entry in enumerate(self.entries)
        ]
        super().__init__(examples[heldout_size:], examples[:heldout_size])

    def score(self, completion: str, example: Example) -> float:
        entry = self.entries[int(example.meta["index"])]
        value = self.dataset.score_answer(last_answer(completion), entry)
        return float(min(max(value or 0.0, 0.0), 1.0))
