"""Multi-hop question answering over a document collection (HotpotQA style), scored EM / F1.

The question alone is the prompt: an agent finds the supporting documents with its ``search``
tool over :attr:`MultiHopQATask.documents`. Rows come from local JSONL/JSON/Parquet in the
HotpotQA layout (``question``, ``answer``, ``context`` as ``[[title, [sentence, ...]], ...]``)
or with ``documents`` as ``[{"title", "text"}]``; or from the seeded synthetic knowledge base
(:func:`.synthetic_kb.synthetic_kb`), which the tests and the demo use. Answers are normalised
as in HotpotQA's evaluation (lower case, no punctuation or articles).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .answers import exact_match, token_f1
from .base import Example, Task, make_prompt, read_rows, split_rows
from .synthetic_kb import synthetic_kb

DEFAULT_INSTRUCTION = " Answer with a few words only."


def row_documents(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The documents of one HotpotQA-style row (``context`` pairs or ``documents`` dicts)."""
    if "documents" in row:
        return [{"title": str(d["title"]), "text": str(d["text"])} for d in row["documents"]]
    pairs = row.get("context") or []
    if isinstance(pairs, Mapping):  # the Hugging Face HotpotQA layout: {"title": [...], ...}
        pairs = list(zip(pairs["title"], pairs["sentences"], strict=True))
    return [{"title": str(t), "text": " ".join(map(str, s)).strip()} for t, s in pairs]


class MultiHopQATask(Task):
    """Questions whose answer needs several documents; reward = EM (``"em"``) or token F1."""

    max_new_tokens = 64

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        documents: Sequence[Mapping[str, str]] = (),
        heldout: Sequence[Mapping[str, Any]] | None = None,
        *,
        metric: str = "f1",
        heldout_size: int = 100,
        seed: int = 0,
        instruction: str = DEFAULT_INSTRUCTION,
        chat: bool = True,
        system: str | None = None,
        name: str = "multihop_qa",
    ) -> None:
        if metric not in ("em", "f1"):
            raise ValueError(f"metric must be 'em' or 'f1', got {metric!r}")
        if heldout is None:
            rows, heldout = split_rows(rows, heldout_size, seed)
        self.name, self.metric = name, metric
        by_title: dict[str, dict[str, str]] = {}
        for doc in [*documents, *(d for r in [*rows, *heldout] for d in row_documents(r))]:
            title = str(doc["title"])
            by_title.setdefault(title, {"title": title, "text": str(doc["text"])})
        self.documents = [{"id": f"d{i}", **d} for i, d in enumerate(by_title.values())]

        def convert(row: Mapping[str, Any]) -> Example:
            golds = row["answer"] if not isinstance(row["answer"], str) else [row["answer"]]
            prompt = make_prompt(f"{row['question']}{instruction}", chat=chat, system=system)
            meta = {"answers": [str(g) for g in golds], "supporting": row.get("supporting", [])}
            return Example(prompt, str(golds[0]), None, meta)

        super().__init__([convert(r) for r in rows], [convert(r) for r in heldout])

    @classmethod
    def synthetic(cls, *, kb_seed: int = 0, size: dict[str, int] | None = None, **kwargs: Any):
        """The task over a seeded synthetic knowledge base (``size``: people, companies, ...)."""
        kb = synthetic_kb(seed=kb_seed, **(size or {}))
        return cls(
            kb["records"], kb["documents"], name=kwargs.pop("name", "synthetic_2hop"), **kwargs
        )

    @classmethod
    def from_files(
        cls,
        path: str | Path,
        heldout_path: str | Path | None = None,
        *,
        corpus_path: str | Path | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> MultiHopQATask:
        """Rows from ``path`` (and ``heldout_path``); extra documents from ``corpus_path``."""
        held = read_rows(heldout_path, limit) if heldout_path else None
        documents = read_rows(corpus_path) if corpus_path else ()
        return cls(read_rows(path, limit), documents, held, **kwargs)

    def score(self, completion: str, example: Example) -> float:
        answer = completion.strip().split("\n", 1)[0]
        fn = exact_match if self.metric == "em" else token_f1
        return max(fn(answer, g) for g in example.meta["answers"])

    def is_correct(self, completion: str, example: Example) -> bool:
        answer = completion.strip().split("\n", 1)[0]
        return any(exact_match(answer, g) for g in example.meta["answers"])
