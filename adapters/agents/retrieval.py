"""A local corpus of passages and a BM25 index over it (``bm25s``), for the ``search`` tool.

Scores come from ``bm25s``; the ranking is ours: score descending, then corpus order, so equal
scores always come back in the same order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

TOKEN_PATTERN = r"(?u)\b\w+\b"  # single characters count: "7", "x", "é"


@dataclass(frozen=True)
class Passage:
    """One retrievable unit: a stable id, a title and the text."""

    id: str
    title: str
    text: str


class Corpus(Sequence[Passage]):
    """Passages with unique ids, in a fixed order (the tie-break of the ranking)."""

    def __init__(self, passages: Iterable[Passage]) -> None:
        self.passages = tuple(passages)
        seen: set[str] = set()
        for passage in self.passages:
            if not isinstance(passage, Passage):
                raise TypeError(f"a corpus holds Passage objects, got {type(passage).__name__}")
            if passage.id in seen:
                raise ValueError(f"duplicate passage id {passage.id!r}")
            seen.add(passage.id)
        if not self.passages:
            raise ValueError("a corpus needs at least one passage")

    @classmethod
    def from_jsonl(cls, path: str | PathLike[str]) -> Corpus:
        """One JSON object ``{"id", "title", "text"}`` a line; ``title`` may be missing."""
        passages = []
        with Path(path).open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    passages.append(_passage(json.loads(line), f"{path}:{number}"))
        return cls(passages)

    def __getitem__(self, index: Any) -> Any:
        return self.passages[index]

    def __len__(self) -> int:
        return len(self.passages)

    def __iter__(self) -> Iterator[Passage]:
        return iter(self.passages)


def _passage(record: Any, where: str) -> Passage:
    if not isinstance(record, dict) or not {"id", "text"} <= record.keys():
        raise ValueError(f"{where}: expected an object with 'id', 'text' and optionally 'title'")
    return Passage(str(record["id"]), str(record.get("title", "")), str(record["text"]))


@dataclass(frozen=True)
class Hit:
    """A passage and its BM25 score for one query."""

    passage: Passage
    score: float


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the search tool needs bm25s: pip install 'esbox[agents]' (or pip install bm25s)"
        ) from exc
    return bm25s


class BM25Index:
    """BM25 over each passage's title and text; an optional ``stemmer`` maps a list of words."""

    def __init__(
        self,
        corpus: Corpus | Sequence[Passage],
        stemmer: Callable[[list[str]], list[str]] | None = None,
        stopwords: str | list[str] | None = "en",
    ) -> None:
        self.corpus = corpus if isinstance(corpus, Corpus) else Corpus(corpus)
        self.stemmer = stemmer
        self.stopwords = stopwords
        bm25s = _bm25s()
        texts = [f"{p.title}\n{p.text}" for p in self.corpus]
        self.retriever = bm25s.BM25()
        self.retriever.index(self._tokens(texts), show_progress=False)

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        return _bm25s().tokenize(
            texts,
            token_pattern=TOKEN_PATTERN,
            stopwords=self.stopwords or [],
            stemmer=self.stemmer,
            return_ids=False,
            show_progress=False,
        )

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every passage, in corpus order (zeros when no word is indexed)."""
        ids = self.retriever.get_tokens_ids(self._tokens([query])[0])
        if not ids:
            return np.zeros(len(self.corpus), dtype=np.float64)
        return np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float64)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The ``k`` best passages with a positive score, best first, ties in corpus order."""
        scores = self.scores(query)
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return [Hit(self.corpus[i], float(scores[i])) for i in order if scores[i] > 0]
