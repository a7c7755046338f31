"""A chain of dependent calculator steps whose length is a knob: ``horizon`` h (1 to 8) steps,
each applied to the previous step's result, so a trajectory that uses the calculator makes h
dependent calls — the x-axis of the horizon benchmark.

Each step multiplies by a small number, adds or subtracts a 3-4-digit one (numbers a small
model gets wrong by heart). With ``branching`` every step after the first depends on the
parity of the result so far ("if it is even, add 512, else subtract 77"), which no single
expression can fold: the model must read each result before the next call. The reward is 1 for
the exact final number (the last ``<answer>``'s text, else the completion); with
``progress_credit`` c > 0 an answer equal to the k-th intermediate result x_k (0 < k < h) earns
c·k/h instead of 0 — a shaped reward that gives ES and GRPO differences to follow on chains
the base model never finishes, while success (``is_correct``) stays the exact final number.
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np

from esbox.errors import ConfigError

from .answers import fallback_match
from .base import Example, Task, make_prompt
from .checks import check_fraction
from .tool_math import _plain_number, answer_text

MAX_HORIZON = 8
INSTRUCTION = " Use the calculator for each step, one call a step."


def _operation(rng: np.random.Generator, value: int) -> tuple[str, int]:
    """One step's wording and its result (multiplying only while the value is small)."""
    kind = int(rng.integers(3 if abs(value) < 100_000 else 2))
    n = int(rng.integers(100, 10_000))
    if kind == 0:
        return f"add {n}", value + n
    if kind == 1:
        return f"subtract {n}", value - n
    k = int(rng.integers(3, 30))
    return f"multiply by {k}", value * k


def chain_problem(rng: np.random.Generator, horizon: int, branching: bool) -> tuple[str, list]:
    """The question and the values x0 .. x_h of one chain."""
    values = [int(rng.integers(100, 10_000))]
    steps = []
    for t in range(horizon):
        wording, result = _operation(rng, values[-1])
        if branching and t > 0:
            other, other_result = _operation(rng, values[-1])
            if values[-1] % 2:  # odd: the second branch
                result = other_result
            wording = f"if the result is even, {wording}; if it is odd, {other}"
        steps.append(f"Step {t + 1}: {wording}.")
        values.append(result)
    question = f"Start with {values[0]}. " + " ".join(steps) + " What is the final number?"
    return question, values


class ToolChainTask(Task):
    """Seeded chains of ``horizon`` dependent steps; train and held-out never share a chain."""

    name = "tool_chain"
    max_new_tokens = 128

    def __init__(
        self,
        *,
        horizon: int = 2,
        branching: bool = False,
        train_size: int = 2000,
        heldout_size: int = 200,
        seed: int = 0,
        chat: bool = True,
        system: str | None = None,
        instruction: str = INSTRUCTION,
        progress_credit: float = 0.0,
    ) -> None:
        self.progress_credit = check_fraction("progress_credit", progress_credit)
        if isinstance(horizon, bool) or not isinstance(horizon, int):
            raise ConfigError(f"problem.task.horizon must be an integer in [1, {MAX_HORIZON}]")
        if not 1 <= horizon <= MAX_HORIZON:
            raise ConfigError(
                f"problem.task.horizon must be an integer in [1, {MAX_HORIZON}], got {horizon}"
            )
        if min(train_size, heldout_size) < 0:
            raise ConfigError(f"sizes must be >= 0, got {train_size} and {heldout_size}")
        rng = np.random.default_rng([seed, horizon, int(branching)])
        seen: set[str] = set()
        examples: list[Example] = []
        while len(examples) < train_size + heldout_size:
            question, values = chain_problem(rng, horizon, branching)
            if question in seen:
                continue
            seen.add(question)
            prompt = make_prompt(f"{question}{instruction}", chat=chat, system=system)
            meta = {"horizon": horizon, "values": values}
            examples.append(Example(prompt, str(values[-1]), None, meta))
        self.name = f"tool_chain/h{horizon}"
        super().__init__(examples[heldout_size:], examples[:heldout_size])

    def score(self, completion: str, example: Example) -> float:
        return float(_matches(answer_text(completion), example.answer))

    def reward(self, completion: str, example: Example) -> float:
        """1 for the final number; ``progress_credit`` · k/h for the furthest intermediate x_k."""
        full = self.score(completion, example)
        if full >= 1.0 or not self.progress_credit:
            return full
        text = answer_text(completion)
        values = example.meta["values"]
        reached = [k for k in range(1, len(values) - 1) if _matches(text, str(values[k]))]
        return self.progress_credit * max(reached, default=0) / (len(values) - 1)


def _matches(text: str, answer: str) -> bool:
    """Whether an answer's text is the number ``answer`` (exactly, when it is a plain number)."""
    number = _plain_number(text)
    if number is not None:
        return number == Decimal(answer)
    return bool(fallback_match(text, answer))
