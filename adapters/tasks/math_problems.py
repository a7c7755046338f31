"""Math word problems (GSM8K-style) with a final answer checked by ``math-verify``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .answers import (
    fallback_match,
    gsm8k_final_answer,
    last_boxed,
    math_verify_available,
    math_verify_match,
)
from .base import Example, RowTask, make_prompt, split_rows

DEFAULT_MATH_INSTRUCTION = "\nPut your final answer within \\boxed{}."


class MathTask(RowTask):
    """Math word problems with a final answer; reward = correctness (+ ``format_weight`` if boxed).

    ``rows`` are mappings with ``question_key`` and ``answer_key``; GSM8K-style
    answers (``... #### 42``) are reduced to the final answer. Correctness uses
    ``math-verify`` when installed (``use_math_verify=None``: auto), else
    :func:`fallback_match`. Without ``heldout`` rows, ``heldout_size`` rows are
    split off ``train`` with ``seed``.
    """

    max_new_tokens = 512

    def __init__(
        self,
        train: Sequence[Mapping[str, Any]],
        heldout: Sequence[Mapping[str, Any]] | None = None,
        *,
        question_key: str = "question",
        answer_key: str = "answer",
        heldout_size: int = 200,
        seed: int = 0,
        instruction: str = DEFAULT_MATH_INSTRUCTION,
        chat: bool = True,
        system: str | None = None,
        prefill: str | None = None,
        format_weight: float = 0.0,
        use_math_verify: bool | None = None,
        max_new_tokens: int | None = None,
        name: str = "math",
    ) -> None:
        if heldout is None:
            train, heldout = split_rows(train, heldout_size, seed)
        self.name = name
        self.format_weight = float(format_weight)
        if use_math_verify is None:
            use_math_verify = math_verify_available()
        elif use_math_verify and not math_verify_available():
            raise ImportError(
                "math-verify is not installed: pip install 'math-verify[antlr4_13_2]' "
                "(part of esbox[llm])"
            )
        self.use_math_verify = use_math_verify
        if max_new_tokens is not None:
            self.max_new_tokens = max_new_tokens

        def convert(row: Mapping[str, Any]) -> Example:
            question, raw = str(row[question_key]), str(row[answer_key])
            prompt = make_prompt(question + instruction, chat=chat, system=system)
            return Example(prompt, gsm8k_final_answer(raw), prefill, {"question": question})

        super().__init__([convert(r) for r in train], [convert(r) for r in heldout])

    def score(self, completion: str, example: Example) -> float:
        if self.use_math_verify:
            return float(math_verify_match(completion, example.answer))
        return float(fallback_match(completion, example.answer))

    def reward(self, completion: str, example: Example) -> float:
        bonus = self.format_weight if last_boxed(completion) is not None else 0.0
        return self.score(completion, example) + bonus
