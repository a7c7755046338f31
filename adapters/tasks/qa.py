"""Short-answer question answering scored by exact match or token F1 (SQuAD/HotpotQA style)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .answers import exact_match, token_f1
from .base import Example, RowTask, make_prompt, split_rows


class QATask(RowTask):
    """Short-answer QA; reward = max over gold answers of exact match (``"em"``) or token F1.

    Rows carry ``question_key``, ``answers_key`` (a string or a list of strings)
    and optionally ``context_key``. The completion is cut at the first newline.
    """

    max_new_tokens = 32
    stop = ("\n",)

    def __init__(
        self,
        train: Sequence[Mapping[str, Any]],
        heldout: Sequence[Mapping[str, Any]] | None = None,
        *,
        question_key: str = "question",
        answers_key: str = "answers",
        context_key: str | None = "context",
        metric: str = "f1",
        heldout_size: int = 200,
        seed: int = 0,
        template: str = "{context}Question: {question}\nAnswer with a few words only.",
        chat: bool = True,
        system: str | None = None,
        prefill: str | None = None,
        name: str = "qa",
    ) -> None:
        if metric not in ("em", "f1"):
            raise ValueError(f"metric must be 'em' or 'f1', got {metric!r}")
        if heldout is None:
            train, heldout = split_rows(train, heldout_size, seed)
        self.name, self.metric = name, metric

        def convert(row: Mapping[str, Any]) -> Example:
            golds = row[answers_key]
            golds = [golds] if isinstance(golds, str) else [str(g) for g in golds]
            context = str(row.get(context_key) or "") if context_key else ""
            text = template.format(
                context=context + "\n\n" if context else "", question=row[question_key]
            )
            return Example(
                make_prompt(text, chat=chat, system=system), golds[0], prefill, {"answers": golds}
            )

        super().__init__([convert(r) for r in train], [convert(r) for r in heldout])

    def score(self, completion: str, example: Example) -> float:
        answer = completion.split("\n", 1)[0]
        fn = exact_match if self.metric == "em" else token_f1
        return max(fn(answer, g) for g in example.meta.get("answers", [example.answer]))

    def is_correct(self, completion: str, example: Example) -> bool:
        answer = completion.split("\n", 1)[0]
        return any(exact_match(answer, g) for g in example.meta.get("answers", [example.answer]))
