"""Multi-step arithmetic word problems generated from a seed, sized so that a tool decides success.

Four families, each exact in integers: 3-4-digit products, sums of several 3-4-digit terms,
percentages of a number, and a two-step word problem (a product, then a difference). A small
model rarely gets them right by heart; with a calculator or the python tool it can. The reward
is the math-verified final answer (the text of ``<answer>`` in an agent rollout); penalties for
malformed calls or running out of turns are the agent evaluator's (``problem.agent``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from .answers import fallback_match, math_verify_available, math_verify_match
from .base import Example, Task, make_prompt

Problem = tuple[str, str, dict]  # question, gold answer, meta


def _product(rng: np.random.Generator) -> Problem:
    a, b = int(rng.integers(100, 10_000)), int(rng.integers(100, 10_000))
    return f"What is {a} times {b}?", str(a * b), {"a": a, "b": b}


def _sum(rng: np.random.Generator) -> Problem:
    terms = [int(x) for x in rng.integers(100, 10_000, size=int(rng.integers(4, 7)))]
    listed = ", ".join(map(str, terms[:-1])) + f" and {terms[-1]}"
    return f"What is the sum of {listed}?", str(sum(terms)), {"terms": terms}


def _percentage(rng: np.random.Generator) -> Problem:
    percent = int(rng.choice([5, 12, 15, 18, 24, 35, 45, 65, 85]))
    base = 20 * int(rng.integers(10, 500))  # a multiple of 20: every listed percent is exact
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

    Questions are distinct and train/held-out are disjoint. ``instruction`` follows each
    question; the answer is checked with ``math-verify`` when installed, else numerically.
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
        rng = np.random.default_rng(seed)
        seen: set[str] = set()
        problems: list[Problem] = []
        while len(problems) < train_size + heldout_size:
            family = families[int(rng.integers(len(families)))]
            question, answer, meta = FAMILIES[family](rng)
            if question not in seen:
                seen.add(question)
                problems.append((question, answer, {"family": family, **meta}))
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
        if self.use_math_verify:
            return float(math_verify_match(completion, example.answer))
        return float(fallback_match(completion, example.answer))
