"""The task contract: prompts plus a verifiable reward, and the rows they are read from.

A :class:`Task` holds ``train`` and ``heldout`` lists of :class:`Example` and scores a completion
with ``reward``. Every member of an ES step is scored on the same minibatch, drawn by
:meth:`Task.sample_batch` from ``(seed, step)`` alone. :class:`RowTask` reads its rows from
JSONL/JSON/Parquet files.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from esbox.adapters.generation.backend import Prompt


@dataclass
class Example:
    """One prompt with its gold answer; ``prefill`` is text the assistant turn starts with."""

    prompt: Prompt
    answer: str
    prefill: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    """Prompts + a verifiable reward. Subclasses set the splits and implement :meth:`score`.

    ``score`` is correctness in [0, 1]; ``reward`` adds any shaping on top (a
    format bonus). ``max_new_tokens`` and ``stop`` are the task's generation
    defaults. A reward sees the completion only, not the prompt or prefill.
    """

    name: str = "task"
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __init__(self, train: Sequence[Example], heldout: Sequence[Example]) -> None:
        self.train = list(train)
        self.heldout = list(heldout)

    @abstractmethod
    def score(self, completion: str, example: Example) -> float:
        """Correctness of ``completion`` for ``example``, in [0, 1]."""

    def reward(self, completion: str, example: Example) -> float:
        return self.score(completion, example)

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.score(completion, example) >= 1.0

    def rewards(self, completions: Sequence[str], examples: Sequence[Example]) -> list[float]:
        return [self.reward(c, e) for c, e in zip(completions, examples, strict=True)]

    def split(self, name: str) -> list[Example]:
        if name not in ("train", "heldout"):
            raise ValueError(f"unknown split {name!r}; use 'train' or 'heldout'")
        return self.train if name == "train" else self.heldout

    def sample_batch(self, step: int, size: int, seed: int = 0) -> list[Example]:
        """The training minibatch of ``step``: a function of ``(seed, step)`` only.

        Epochs are seeded permutations of ``train``; batch ``step`` is the slice
        ``[step*size, (step+1)*size)`` of their concatenation, so every example
        is seen once per epoch and all members of a step share the batch.
        """
        n = len(self.train)
        if n == 0 or size < 1 or step < 0:
            raise ValueError(f"need a non-empty train split, size >= 1, step >= 0 (n={n})")
        out: list[Example] = []
        pos = step * size
        while len(out) < size:
            epoch, offset = divmod(pos, n)
            perm = np.random.default_rng([seed, epoch]).permutation(n)
            take = perm[offset : offset + size - len(out)]
            out.extend(self.train[int(i)] for i in take)
            pos += len(take)
        return out

    def __repr__(self) -> str:
        sizes = f"train={len(self.train)}, heldout={len(self.heldout)}"
        return f"{type(self).__name__}(name={self.name!r}, {sizes})"


def make_prompt(text: str, *, chat: bool = True, system: str | None = None) -> Prompt:
    """Chat messages (optionally with a system turn) or the raw text."""
    if not chat:
        return text
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": text}]


def with_context(prompt: Prompt, context: str | None) -> Prompt:
    """``prompt`` read after ``context`` (an ESOpt context): a first system message, or a first
    paragraph of a plain-text prompt; unchanged without one."""
    if context is None:
        return prompt
    if isinstance(prompt, str):
        return f"{context}\n\n{prompt}"
    return [{"role": "system", "content": context}, *prompt]


def read_rows(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl``, ``.json`` (a list) or ``.parquet`` file."""
    p = Path(path).expanduser()
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("reading Parquet needs pyarrow: pip install pyarrow") from exc
        rows = pq.read_table(p).to_pylist()
    elif suffix == ".json":
        rows = json.loads(p.read_text(encoding="utf-8"))
    else:
        with p.open(encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return rows[:limit] if limit is not None else rows


def split_rows(rows: Sequence[Any], heldout_size: int, seed: int) -> tuple[list[Any], list[Any]]:
    """Seeded disjoint (train, heldout) split of one list of rows."""
    if not 0 < heldout_size < len(rows):
        raise ValueError(f"heldout_size must be in (0, {len(rows)}), got {heldout_size}")
    perm = np.random.default_rng(seed).permutation(len(rows))
    held = {int(i) for i in perm[:heldout_size]}
    train = [r for i, r in enumerate(rows) if i not in held]
    return train, [rows[int(i)] for i in sorted(held)]


class RowTask(Task):
    """A task built from rows (mappings) that can also be read from JSONL/JSON/Parquet files."""

    @classmethod
    def from_files(
        cls,
        path: str | Path,
        heldout_path: str | Path | None = None,
        *,
        limit: int | None = None,
        **kwargs: Any,
    ) -> RowTask:
        """Train rows from ``path`` and held-out rows from ``heldout_path`` (in file order)."""
        held = read_rows(heldout_path, limit) if heldout_path else None
        return cls(read_rows(path, limit), held, **kwargs)
