"""Synthetic integer arithmetic generated from a seed: the embedded default task, no download."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .answers import first_integer
from .base import Example, Task, make_prompt

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticTask(Task):
    """Synthetic integer arithmetic generated from a seed; no download.

    Prompt: ``What is a + b?`` as a chat turn; prefill ``a + b = ``; reward 1
    when the first integer of the completion is the answer. Questions are
    distinct and train/held-out are disjoint. The default (two-digit addition)
    puts SmolLM2-135M-Instruct at about 27% held-out accuracy, greedy, 4 tokens.
    """

    max_new_tokens = 4

    def __init__(
        self,
        *,
        digits: int = 2,
        ops: Iterable[str] = ("+",),
        train_size: int = 2000,
        heldout_size: int = 200,
        seed: int = 0,
        chat: bool = True,
        system: str | None = None,
        question: str = "What is {a} {op} {b}?",
        use_prefill: bool = True,
        name: str = "arithmetic",
    ) -> None:
        ops = tuple(ops)
        if digits < 1 or not ops or any(op not in _OPS for op in ops):
            raise ValueError(f"digits must be >= 1 and ops a subset of {sorted(_OPS)}")
        low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
        space = (high - low + 1) ** 2 * len(ops)
        total = train_size + heldout_size
        if total > space:
            raise ValueError(f"{total} questions asked but only {space} distinct ones exist")
        rng = np.random.default_rng(seed)
        seen: set[tuple[int, str, int]] = set()
        triples: list[tuple[int, str, int]] = []
        while len(triples) < total:
            a, b = (int(x) for x in rng.integers(low, high + 1, size=2))
            t = (a, ops[int(rng.integers(len(ops)))], b)
            if t not in seen:
                seen.add(t)
                triples.append(t)
        self.name = name

        def convert(t: tuple[int, str, int]) -> Example:
            a, op, b = t
            prompt = make_prompt(question.format(a=a, op=op, b=b), chat=chat, system=system)
            prefill = f"{a} {op} {b} = " if use_prefill else None
            return Example(prompt, str(_OPS[op](a, b)), prefill, {"a": a, "op": op, "b": b})

        super().__init__(
            [convert(t) for t in triples[heldout_size:]],
            [convert(t) for t in triples[:heldout_size]],
        )

    def score(self, completion: str, example: Example) -> float:
        value = first_integer(completion)
        return float(value is not None and str(value) == example.answer)
