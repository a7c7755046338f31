"""TextArena's single-player puzzles as esbox environments, offline: the game's own prompt and
board as observations, its own move format (``[row col number]`` for Sudoku) and its own reward
(1 for a solved puzzle, the share done when it ends unsolved).

Only games that run without downloads are offered (:data:`GAMES`); word games that fetch NLTK
corpora at reset are refused with a clear error. TextArena draws its puzzles from Python's
global ``random``, seeded at reset: each episode keeps its own ``random`` state and swaps it in
around the game's calls, so an episode seed gives the same puzzle and the same game however many
episodes run side by side, and nothing else's ``random`` stream is touched.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Mapping
from typing import Any

from esbox.errors import ConfigError, unknown_key_message

from .base import Environment

INSTALL = "TextArena games need the textarena package: pip install 'esbox[environments]'"


def _int_in(lo: int, hi: int | None = None) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= (hi or v)


_TURNS = {"max_turns": ("an integer >= 1", _int_in(1))}
# the games known to run offline: their kwargs and the values each takes
GAMES: dict[str, dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "Sudoku": {"clues": ("an integer in [17, 80]", _int_in(17, 80)), **_TURNS},
    "TowerOfHanoi": {"num_disks": ("an integer in [1, 10]", _int_in(1, 10)), **_TURNS},
    "LightsOut": {"size": ("an integer in [2, 10]", _int_in(2, 10)), **_TURNS},
    "Mastermind": {
        "code_length": ("an integer in [1, 9]", _int_in(1, 9)),
        "num_numbers": ("an integer in [1, 9]", _int_in(1, 9)),
        "duplicate_numbers": ("true or false", lambda v: isinstance(v, bool)),
        **_TURNS,
    },
    "FifteenPuzzle": dict(_TURNS),
    "GuessTheNumber": {
        "min_number": ("an integer >= 0", _int_in(0)),
        "max_number": ("an integer >= 1", _int_in(1)),
        **_TURNS,
    },
    "Minesweeper": {
        "rows": ("an integer in [2, 30]", _int_in(2, 30)),
        "cols": ("an integer in [2, 30]", _int_in(2, 30)),
        "num_mines": ("an integer >= 1", _int_in(1)),
        **_TURNS,
    },
}
NEEDS_DOWNLOADS = ("Hangman", "Wordle", "WordLadder", "WordSearch", "Crosswords")


def _registry() -> Mapping[str, Any]:
    try:
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError as exc:
        raise ConfigError(f"problem.task: {INSTALL}") from exc  # exit 2, not a traceback
    return ENV_REGISTRY


def game_ids() -> list[str]:
    """The TextArena ids esbox runs (difficulty variants included, wrapper variants not)."""
    return sorted(
        i
        for i, spec in _registry().items()
        if _game_of(spec) in GAMES and not i.endswith(("-train", "-raw"))
    )


def _game_of(spec: Any) -> str:
    entry = spec.entry_point if isinstance(spec.entry_point, str) else spec.entry_point.__module__
    return entry.split("textarena.envs.", 1)[-1].split(".", 1)[0]


def game_spec(game_id: Any, kwargs: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """The game class of ``game_id`` and its full kwargs; ConfigError names a bad key or value."""
    registry = _registry()
    spec = registry.get(game_id) if isinstance(game_id, str) else None
    game = _game_of(spec) if spec is not None else None
    if game in NEEDS_DOWNLOADS or any(str(game_id).startswith(f"{g}-") for g in NEEDS_DOWNLOADS):
        raise ConfigError(
            f"problem.task.id: {game_id!r} needs NLTK corpora downloaded at reset, which esbox "
            f"does not fetch; offline games: {', '.join(game_ids())}"
        )
    if spec is None or game not in GAMES or str(game_id).endswith(("-train", "-raw")):
        raise ConfigError(
            f"problem.task.id: {unknown_key_message('game', str(game_id), game_ids())}"
        )
    allowed = GAMES[game]
    given = dict(kwargs or {})
    for key, value in given.items():
        if key not in allowed:
            raise ConfigError(
                f"problem.task.kwargs: {unknown_key_message(f'{game} option', key, allowed)}"
            )
        what, ok = allowed[key]
        if not ok(value):
            raise ConfigError(f"problem.task.kwargs.{key} must be {what}, got {value!r}")
    merged = {**spec.kwargs, **given}
    duplicates = merged["duplicate_numbers"] if game == "Mastermind" else True
    if not duplicates and merged["code_length"] > merged["num_numbers"]:
        raise ConfigError(
            "problem.task.kwargs.code_length must be <= num_numbers without duplicate_numbers"
        )
    if game == "GuessTheNumber" and merged["min_number"] >= merged["max_number"]:
        raise ConfigError("problem.task.kwargs.max_number must be > min_number")
    if game == "Minesweeper" and merged["num_mines"] >= merged["rows"] * merged["cols"]:
        raise ConfigError("problem.task.kwargs.num_mines must be < rows * cols")
    module, _, name = spec.entry_point.partition(":")
    return getattr(importlib.import_module(module), name), merged


class TextArenaGame(Environment):
    """One episode of a TextArena single-player game: ``reset(seed=...)``, ``step(reply)``,
    ``reward()``; the observations are the game's messages since the last move."""

    def __init__(self, game_id: str, kwargs: Mapping[str, Any] | None = None) -> None:
        self.game_id = game_id
        self._cls, self._kwargs = game_spec(game_id, kwargs)
        self._game: Any = None
        self._random: Any = None
        self._done = False

    def _call(self, fn: Callable[[], Any], seed: int | None = None) -> Any:
        """``fn()`` with this episode's ``random`` state swapped in (seeded by ``seed``)."""
        outer = random.getstate()
        try:
            if seed is not None:
                random.seed(seed)
            else:
                random.setstate(self._random)
            return fn()
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def reset(self, seed: int = 0, **row: Any) -> str:
        self._game, self._done = self._cls(**self._kwargs), False
        self._call(lambda: self._game.reset(num_players=1, seed=int(seed)), seed=int(seed))
        return self._observation()

    def step(self, text: str) -> tuple[str, bool]:
        """Play the reply as a move (in brackets when it has none, as TextArena's own wrapper
        does); the game's answer and whether the episode is over."""
        if self._game is None:
            raise RuntimeError("step before reset")
        if self._done:
            return "The game is over.", True
        move = text if "[" in text or "]" in text else f"[{text}]"
        done, _ = self._call(lambda: self._game.step(move))
        self._done = bool(done)
        observation = self._observation()
        if self._done:
            reason = self._game.state.game_info[0].get("reason")
            observation = f"{observation}\n[GAME] {reason}".strip() if reason else observation
        return observation, self._done

    def reward(self) -> float:
        """The game's reward once it is over (1 solved, else its share done); before that, the
        share done the game itself would give at its turn limit (0 where it has none)."""
        if self._game is None:
            return 0.0
        if not self._done:
            share = getattr(self._game, "_get_percentage_completion", None)
            return float(self._call(share)) if callable(share) else 0.0
        rewards, _ = self._game.close()
        return float((rewards or {}).get(0, 0.0))

    def _observation(self) -> str:
        """The game's messages to the player since the last call, as TextArena's LLM wrapper
        writes them (``[GAME] ...``); the player's own move, echoed back, is left out."""
        _, messages = self._game.get_observation()
        return "\n".join(
            f"[GAME] {text}".strip() for sender, text, _ in messages or () if sender != 0
        ).strip()
