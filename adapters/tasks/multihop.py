"""Multi-hop question answering over a document collection (HotpotQA style), scored EM / F1.

The question alone is the prompt: an agent finds the supporting documents with its ``search``
tool over :attr:`MultiHopQATask.documents`. Rows come from local JSONL/JSON/Parquet in the
HotpotQA layout (``question``, ``answer``, ``context`` as ``[[title, [sentence, ...]], ...]``)
or with ``documents`` as ``[{"title", "text"}]``; or from the seeded synthetic knowledge base
(:func:`.synthetic_kb.synthetic_kb`), which the tests and the demo use. Answers are scored as
HotpotQA's evaluation does (:func:`hotpot_em`, :func:`hotpot_f1`).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .answers import normalize_qa
from .base import Example, Task, make_prompt, read_rows, split_rows
from .synthetic_kb import synthetic_kb
from .tool_math import last_answer

DEFAULT_INSTRUCTION = " Answer with a few words only."
_SPECIAL = ("yes", "no", "noanswer")  # HotpotQA: partial credit never goes to these


def hotpot_em(prediction: str, gold: str) -> float:
    """HotpotQA exact match: equal after normalisation (lower case, no punctuation or articles,
    single spaces)."""
    return float(normalize_qa(prediction) == normalize_qa(gold))


def hotpot_f1(prediction: str, gold: str) -> float:
    """HotpotQA token F1: as SQuAD's, but a yes/no/noanswer prediction or gold scores 0 unless
    both are equal, and nothing in common (an empty answer too) scores 0."""
    pred, ref = normalize_qa(prediction), normalize_qa(gold)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    common = collections.Counter(pred.split()) & collections.Counter(ref.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred.split()), same / len(ref.split())
    return 2 * precision * recall / (precision + recall)


def _text(sentences: Any) -> str:
    """A paragraph from its sentences (HotpotQA's carry their leading spaces) or a string."""
    if isinstance(sentences, str):
        return sentences.strip()
    return " ".join(str(s).strip() for s in sentences if str(s).strip())


def row_documents(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The documents of one HotpotQA-style row (``context`` pairs or ``documents`` dicts)."""
    if "documents" in row:
        return [{"title": str(d["title"]), "text": _text(d["text"])} for d in row["documents"]]
    pairs = row.get("context") or []
    if isinstance(pairs, Mapping):  # the Hugging Face HotpotQA layout: {"title": [...], ...}
        pairs = list(zip(pairs["title"], pairs["sentences"], strict=True))
    return [{"title": str(t), "text": _text(s)} for t, s in pairs]


def row_supporting(row: Mapping[str, Any]) -> list[str]:
    """Titles of the documents a row's answer needs: ``supporting``, else the titles of
    HotpotQA's ``supporting_facts`` (``[[title, sentence], ...]`` or the Hugging Face dict)."""
    if "supporting" in row:
        return [str(t) for t in row["supporting"]]
    facts = row.get("supporting_facts") or []
    titles = facts["title"] if isinstance(facts, Mapping) else [f[0] for f in facts]
    return list(dict.fromkeys(map(str, titles)))


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
            meta = {"answers": [str(g) for g in golds], "supporting": row_supporting(row)}
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
        """The best EM or F1 over the gold answers of the final answer: the last ``<answer>``'s
        text, else the completion, up to its first line break."""
        fn = hotpot_em if self.metric == "em" else hotpot_f1
        return max(fn(final_line(completion), g) for g in example.meta["answers"])

    def is_correct(self, completion: str, example: Example) -> bool:
        return any(hotpot_em(final_line(completion), g) for g in example.meta["answers"])


def final_line(completion: str) -> str:
    """The answer a completion gives: its last ``<answer>``'s text (else all of it), first line."""
    return last_answer(completion).split("\n", 1)[0]
