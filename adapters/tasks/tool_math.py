"""Multi-step arithmetic word problems generated from a seed, sized so that a tool decides success.

Four families, each exact in integers: 3-4-digit products, sums of several 3-4-digit terms,
percentages of a number, and a two-step word problem (a product, then a difference). A small
model rarely gets them right by heart; with a calculator or the python tool it can. The reward
is the math-verified final answer (the text of the last ``<answer>`` when there is one);
penalties for malformed calls or running out of turns are the agent evaluator's
(``problem.agent``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation

import numpy as np

from .answers import fallback_match, math_verify_available, math_verify_match
from .base import Example, Task, make_prompt

Problem = tuple[str, str, dict]  # question, gold answer, meta

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
# a plain number: digits with an optional sign, thousands separators and decimals
_PLAIN = re.compile(r"[-+]?(?:\d{1,3}(?:[, ]\d{3})+|\d+)(?:\.\d+)?")
# powers make sympy compute towers such as 9**9**9 (hours; math-verify's timeouts are off)
_RISKY = re.compile(r"\^|\*\*|\\exp|exp\(")
MAX_VERIFIED_CHARS = 1000  # a longer answer is compared by its last number only


def last_answer(completion: str) -> str:
    """The text of the last ``<answer>`` (an unclosed one runs to the end), else the completion,
    stripped: the answer of the agent protocol, also in a single-turn completion."""
    start = completion.rfind(ANSWER_OPEN)
    if start >= 0:
        completion = completion[start + len(ANSWER_OPEN) :].split(ANSWER_CLOSE, 1)[0]
    return completion.strip()


def answer_text(completion: str) -> str:
    """:func:`last_answer`, NFKC-normalised (full-width digits, no-break spaces) and with the
    Unicode minus as ``-``: the number as the model meant it."""
    text = unicodedata.normalize("NFKC", last_answer(completion))
    return text.replace("\u2212", "-").strip()


def _plain_number(text: str) -> Decimal | None:
    """``text`` as an exact number when it is one (``$``, ``\\boxed{}``, a final period allowed)."""
    text = text.strip().strip("$").strip().rstrip(".").strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text)
    text = boxed.group(1).strip() if boxed else text
    if not _PLAIN.fullmatch(text):
        return None
    try:
        return Decimal(text.replace(",", "").replace(" ", ""))
    except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
        return None


def _product(rng: np.random.Generator) -> Problem:
    a, b = int(rng.integers(100, 10_000)), int(rng.integers(100, 10_000))
    return f"What is {a} times {b}?", str(a * b), {"a": a, "b": b}


def _sum(rng: np.random.Generator) -> Problem:
    terms = [int(x) for x in rng.integers(100, 10_000, size=int(rng.integers(4, 7)))]
    listed = ", ".join(map(str, terms[:-1])) + f" and {terms[-1]}"
    return f"What is the sum of {listed}?", str(sum(terms)), {"terms": terms}


def _percentage(rng: np.random.Generator) -> Problem:
    percent = int(rng.choice([5, 12, 15, 18, 24, 35, 45, 65, 85]))
    step = 100 // math.gcd(percent, 100)  # percent * base / 100 is an integer for every base
    base = step * int(rng.integers(-(-200 // step), 10_000 // step))  # in [200, 10000)
    return f"What is {percent}% of {base}?", str(percent * base // 100), {"p": percent, "n": base}


_ITEMS = (  # holder, its plural, what it holds
    ("crate", "crates", "bottles"),
    ("box", "boxes", "pencils"),
    ("pallet", "pallets", "bricks"),
    ("bag", "bags", "apples"),
)


def _two_step(rng: np.random.Generator) -> Problem:
    holder, holders, things = _ITEMS[int(rng.integers(len(_ITEMS)))]
    per, count = int(rng.integers(24, 250)), int(rng.integers(12, 90))
    sold = int(rng.integers(1, per * count))
    question = (
        f"A {holder} holds {per} {things}. A shop orders {count} {holders} and then sells "
        f"{sold} {things}. How many {things} are left?"
    )
    return question, str(per * count - sold), {"per": per, "count": count, "sold": sold}


FAMILIES: dict[str, Callable[[np.random.Generator], Problem]] = {
    "product": _product,
    "sum": _sum,
    "percentage": _percentage,
    "two_step": _two_step,
}


class ToolMathTask(Task):
    """Seeded arithmetic word problems (``families``); reward 1 when the final answer is right.

    Problems are distinct (:func:`problem_key`) and train/held-out are disjoint. ``system`` is
    an optional system prompt (e.g. a worked example), ``instruction`` follows each question;
    the answer is checked exactly, or with ``math-verify`` when installed, else numerically.
    """

    max_new_tokens = 128

    def __init__(
        self,
        *,
        families: Iterable[str] = tuple(FAMILIES),
        train_size: int = 2000,
        heldout_size: int = 200,
        seed: int = 0,
        chat: bool = True,
        system: str | None = None,
        instruction: str = "",
        name: str = "tool_math",
    ) -> None:
        families = tuple(families)
        unknown = [f for f in families if f not in FAMILIES]
        if not families or unknown:
            raise ValueError(f"families must be a non-empty subset of {sorted(FAMILIES)}")
        if min(train_size, heldout_size) < 0:
            raise ValueError(f"sizes must be >= 0, got {train_size} and {heldout_size}")
        rng = np.random.default_rng(seed)
        seen: set[tuple] = set()
        problems: list[Problem] = []
        wanted = train_size + heldout_size
        for _ in range(100 * wanted + 10_000):
            if len(problems) == wanted:
                break
            family = families[int(rng.integers(len(families)))]
            question, answer, meta = FAMILIES[family](rng)
            key = problem_key(family, meta)
            if key not in seen:
                seen.add(key)
                problems.append((question, answer, {"family": family, **meta}))
        else:
            raise ValueError(
                f"only {len(problems)} distinct problems of families {list(families)} found, "
                f"{wanted} wanted: ask for fewer"
            )
        self.name = name
        self.use_math_verify = math_verify_available()

        def convert(problem: Problem) -> Example:
            question, answer, meta = problem
            text = f"{question}{instruction}"
            return Example(make_prompt(text, chat=chat, system=system), answer, None, meta)

        super().__init__(
            [convert(p) for p in problems[heldout_size:]],
            [convert(p) for p in problems[:heldout_size]],
        )

    def score(self, completion: str, example: Example) -> float:
        """1.0 when the final answer (the last ``<answer>``'s text, else the completion) is the
        gold number: exactly when it is a plain number, else by math-verify (its last number
        when it holds a power, which sympy would evaluate, or is very long)."""
        text = answer_text(completion)
        number = _plain_number(text)
        if number is not None:
            return float(number == Decimal(example.answer))
        if self.use_math_verify and len(text) <= MAX_VERIFIED_CHARS and not _RISKY.search(text):
            return float(math_verify_match(text, example.answer))
        return float(fallback_match(text, example.answer))


def problem_key(family: str, meta: dict) -> tuple:
    """What makes two problems the same: ``a times b`` is ``b times a``, a sum is its terms in
    any order; only distinct problems are drawn, so train and held-out never share one."""
    if family == "product":
        return family, tuple(sorted((meta["a"], meta["b"])))
    if family == "sum":
        return family, tuple(sorted(meta["terms"]))
    return family, tuple(sorted(meta.items()))
