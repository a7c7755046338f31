"""Tasks for ES post-training: prompts plus a verifiable reward.

A :class:`Task` holds ``train`` and ``heldout`` lists of :class:`Example` and
scores a completion with ``reward``. Every member of an ES step is scored on
the same minibatch, drawn by :meth:`Task.sample_batch` from ``(seed, step)``
alone. Shipped: :class:`MathTask` (JSONL/Parquet, ``math-verify`` answer
checking), :class:`QATask` (exact match / token F1) and
:class:`ArithmeticTask` (synthetic, generated from a seed, no download).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import (
    exact_match,
    fallback_match,
    first_integer,
    gsm8k_final_answer,
    last_boxed,
    math_verify_available,
    math_verify_match,
    token_f1,
)

Message = Mapping[str, str]
Prompt = str | Sequence[Message]


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


# --------------------------------------------------------------------------- data files


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


# --------------------------------------------------------------------------- math


DEFAULT_MATH_INSTRUCTION = "\nPut your final answer within \\boxed{}."


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


# --------------------------------------------------------------------------- QA


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


# --------------------------------------------------------------------------- arithmetic

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


# --------------------------------------------------------------------------- factory


def load_datasets_rows(
    name: str, split: str, config: str | None = None, **kwargs: Any
) -> list[dict]:
    """Rows of a Hugging Face ``datasets`` split (needs network or a local cache)."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            "a task from a datasets name needs the datasets package: pip install datasets"
        ) from exc
    return list(datasets.load_dataset(name, config, split=split, **kwargs))


def load_task(spec: Mapping[str, Any]) -> Task:
    """Build a task from a config mapping; ``kind`` is math, qa, arithmetic or datasets.

    * ``{"kind": "arithmetic", "digits": 2, "ops": ["+"], "seed": 0}``
    * ``{"kind": "math", "path": "train.jsonl", "heldout_path": "test.jsonl",
      "format_weight": 0.1}``
    * ``{"kind": "qa", "path": "qa.jsonl", "metric": "em"}``
    * ``{"kind": "datasets", "name": "openai/gsm8k", "config": "main", "split": "train",
      "heldout_split": "test", "format": "math"}``: other keys go to the math/QA task.
    """
    opts = dict(spec)
    kind = opts.pop("kind", None)
    try:
        return _build_task(kind, opts)
    except TypeError as exc:  # an unknown or missing option: name it, like a config error
        raise ValueError(f"task (kind {kind!r}): {exc}") from None
    except KeyError as exc:
        raise ValueError(f"task (kind {kind!r}) needs the option {exc}") from None


def _build_task(kind: Any, opts: dict[str, Any]) -> Task:
    if kind == "arithmetic":
        return ArithmeticTask(**opts)
    if kind in ("math", "qa"):
        cls = MathTask if kind == "math" else QATask
        return cls.from_files(opts.pop("path"), opts.pop("heldout_path", None), **opts)
    if kind == "datasets":
        name, fmt = opts.pop("name"), opts.pop("format", "math")
        config, split = opts.pop("config", None), opts.pop("split", "train")
        heldout_split = opts.pop("heldout_split", None)
        limit = opts.pop("limit", None)
        train = load_datasets_rows(name, split, config)[:limit]
        held = load_datasets_rows(name, heldout_split, config)[:limit] if heldout_split else None
        cls = {"math": MathTask, "qa": QATask}.get(fmt)
        if cls is None:
            raise ValueError(f"datasets format must be 'math' or 'qa', got {fmt!r}")
        return cls(train, held, name=opts.pop("task_name", name), **opts)
    raise ValueError(f"unknown task kind {kind!r}; use math, qa, arithmetic or datasets")
