"""TextArena single-player games as a task of episodes: each example is an episode seed, and
its environment (``environment_factory``) is the game, reset from that seed, so every member of
an ES step plays the same puzzles. Agent runs only (``problem.agent``): the board arrives at
reset, the replies are the moves, the game's reward is the trajectory's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from esbox.adapters.environments.textarena import TextArenaGame, game_spec
from esbox.errors import ConfigError

from .base import Example, Task, make_prompt


class TextArenaTask(Task):
    """Episodes of the TextArena game ``id`` (with ``kwargs``): ``train_size`` training seeds
    and ``heldout_size`` held-out ones, disjoint, drawn from ``seed``."""

    def __init__(
        self,
        *,
        id: str,
        kwargs: Mapping[str, Any] | None = None,
        train_size: int = 1000,
        heldout_size: int = 100,
        seed: int = 0,
        chat: bool = True,
        system: str | None = None,
        instruction: str = "",
    ) -> None:
        game_spec(id, kwargs)  # an unknown id or a bad option fails here, naming the key
        if train_size < 1 or heldout_size < 0:
            raise ConfigError(f"problem.task.train_size must be >= 1 and heldout_size >= 0, got "
                              f"{train_size} and {heldout_size}")  # fmt: skip
        self.environment_factory = functools.partial(TextArenaGame, id, dict(kwargs or {}))
        try:
            self.environment_factory().reset(seed=0)
        except Exception as exc:  # a game that cannot start with these options
            raise ConfigError(f"problem.task: {id} does not start with {kwargs}: {exc}") from None
        seeds = np.random.default_rng(seed).choice(2**31, train_size + heldout_size, replace=False)
        if not chat:
            raise ConfigError("problem.task.chat: a textarena game is played in chat turns")
        examples = [
            Example(make_prompt(instruction, system=system), "", None, {"seed": int(s), "game": id})
            for s in seeds
        ]
        self.name = f"textarena/{id}"
        super().__init__(examples[heldout_size:], examples[:heldout_size])

    def score(self, completion: str, example: Example) -> float:
        """One move: the game reset from the example's seed, played ``completion``, scored."""
        game = self.environment_factory()
        game.reset(seed=example.meta["seed"])
        game.step(completion)
        return game.reward()
