"""The environment contract: one object per trajectory, reset from a data row, answering the
model's moves (``step``) or calls to its public methods (tools), and scoring the trajectory.

This is TRL's ``environment_factory`` convention, so a class written for TRL's
``GRPOTrainer`` runs in esbox unchanged:

* ``reset(**row)`` starts an episode from the example's row; a string it returns is appended to
  the last user message (the first observation), ``None`` adds nothing;
* every public method other than ``reset``, ``step``, ``reward``/``get_reward`` and ``close`` is a
  tool (its schema from the type hints and the Google-style docstring, as TRL reads it);
* ``step(text) -> (observation, done)`` (esbox's addition, for games that read a move from the
  reply): a reply without a tool call is a move; the observation is the next user turn;
* ``reward()`` (or TRL's ``get_reward()``) scores the episode, partial credit allowed; an
  environment without one leaves the reward to the task's check of the final answer.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

RESERVED = ("reset", "step", "reward", "get_reward", "close")


class Environment:
    """Optional base of an esbox environment: override ``reset``, ``reward`` and either ``step``
    (text moves) or public methods (tools). Nothing requires subclassing it."""

    def reset(self, **row: Any) -> str | None:
        """Start an episode from ``row`` (the example's columns); the first observation."""
        return None

    def reward(self) -> float:
        """The episode's score so far, in [0, 1] for the games here."""
        return 0.0


def tool_methods(environment: Any) -> list[Callable[..., Any]]:
    """The bound methods of ``environment`` that are tools: its class's public functions other
    than the contract's own (TRL lists them on the class, so properties are not evaluated)."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in RESERVED
    ]


def is_text_driven(environment: Any) -> bool:
    """Whether the environment reads moves from the model's replies (it has ``step``)."""
    return callable(getattr(environment, "step", None))


def environment_reward(environment: Any) -> float | None:
    """``reward()`` or TRL's ``get_reward()``, as a float; None when it has neither."""
    for name in ("reward", "get_reward"):
        method = getattr(environment, name, None)
        if callable(method):
            return float(method())
    return None
