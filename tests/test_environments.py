"""Environments in the agent loop (issue 28): the contract on a scripted backend (text moves,
methods as tools, errors, limits), a TRL-style environment class unchanged, TextArena's offline
games with their own rewards, common random numbers across members, bad input, and an ES run on
a tiny model that plays Sudoku."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("textarena")

from cli_runs import invoke_cli  # tests/cli_runs.py
from click.testing import CliRunner

import esbox
from esbox.adapters.agents.episodes import Episode, MethodTool
from esbox.adapters.agents.evaluator import AgentEvaluator
from esbox.adapters.agents.loop import AgentLimits, AgentLoop
from esbox.adapters.agents.tools import Calculator
from esbox.adapters.environments.textarena import TextArenaGame
from esbox.adapters.generation.backend import RenderedPrompt
from esbox.adapters.models.testing import char_tokenizer, save_tiny_lm
from esbox.adapters.tasks.base import Example, Task
from esbox.adapters.tasks.loading import load_task
from esbox.cli.main import cli
from esbox.errors import ConfigError


class ScriptedBackend:
    """A backend whose turn is ``policy(prompt text)``."""

    def __init__(self, policy: Callable[[str], str]) -> None:
        self.tokenizer = char_tokenizer()
        self.policy = policy

    def generate(self, prompts, *, prefills=None, max_new_tokens=64, **_):
        assert all(isinstance(p, RenderedPrompt) for p in prompts)
        return [self.policy(p)[:max_new_tokens] for p in prompts]


class Guess:
    """A text game: guess ``target`` (0-9) in moves ``[n]``; partial credit for being close."""

    def reset(self, target: int = 3, **row) -> str:
        self.target, self.last = int(target), None
        return "\nGuess my digit, as [n]."

    def step(self, text: str) -> tuple[str, bool]:
        found = re.findall(r"\[(\d)\]", text)
        if not found:
            return "Write a move as [n].", False
        self.last = int(found[-1])
        done = self.last == self.target
        return ("right" if done else ("higher" if self.last < self.target else "lower")), done

    def reward(self) -> float:
        return 0.0 if self.last is None else 1.0 - abs(self.last - self.target) / 10


def counting_up(prompt: str) -> str:  # guesses 1, 2, 3, ... one a turn
    return f"I guess [{prompt.count('<|im_start|>assistant')}]"


def rows(*targets: int) -> list[dict]:
    return [{"target": t} for t in targets]


def test_text_moves_reset_observation_and_game_answers_make_the_turns():
    loop = AgentLoop(ScriptedBackend(counting_up), [], limits=AgentLimits(max_turns=5))
    episodes = [Episode(Guess(), r) for r in rows(2, 9)]
    short, cut = loop.run([[{"role": "user", "content": "Play."}]] * 2, episodes=episodes)
    assert short.messages[0] == {"role": "user", "content": "Play.\nGuess my digit, as [n]."}
    assert [m["role"] for m in short.messages] == ["user", "assistant", "user", "assistant"]
    assert short.messages[2]["content"] == "higher" and short.stop == "done" and short.turns == 2
    assert cut.stop == "max_turns" and cut.turns == 5 and cut.messages[-1]["content"] == "higher"
    assert [e.score() for e in episodes] == [1.0, pytest.approx(0.6)]  # partial credit
    assert "<tools>" not in str(loop.prompt(short.messages, {}))  # no tools: no tool protocol


class Counter:
    """Written for TRL's environment_factory: reset(**kwargs), a public method as the tool,
    get_reward()."""

    def reset(self, **kwargs) -> str | None:
        self.count, self.goal = 0, int(kwargs["answer"])
        return None

    def increment(self, step: int) -> str:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.count += step
        return f"The counter is at {self.count}."

    def get_reward(self) -> float:
        return float(self.count == self.goal)


def test_a_trl_environment_class_runs_unchanged_with_its_methods_as_tools():
    from transformers.utils import get_json_schema

    tool = MethodTool(Counter().increment)
    schema = get_json_schema(Counter.increment)["function"]  # what TRL shows the model
    assert (tool.name, tool.description, tool.parameters) == (
        "increment",
        schema["description"],
        schema["parameters"],
    )

    def policy(prompt: str) -> str:
        if "counter is at 5" in prompt:
            return "<answer>done</answer>"
        return '<tool_call>{"name": "increment", "arguments": {"step": 5}}</tool_call>'

    task = FixedTask(["5", "7"])
    loop = AgentLoop(ScriptedBackend(policy), [Calculator()])
    evaluator = AgentEvaluator(task, loop, batch_size=2, environment=Counter)
    assert set(evaluator.tools) == {"calculator", "increment"}
    space = esbox.VectorSpace(np.zeros(3))
    es = esbox.make_strategy("openai_es", space, seed=0, population=2, sigma=0.1)
    assert sorted(evaluator.evaluate(space, es.ask()).tolist()) == [0.5, 0.5]
    hit, miss = evaluator.run(task.train, 0, None)
    assert (hit.env_reward, hit.valid_calls, hit.stop) == (1.0, 1, "answer")
    assert (miss.env_reward, miss.stop, miss.reward) == (0.0, "answer", 0.0)  # counted 5, not 7
    assert "increment" in loop.system_text(hit.messages, evaluator.tools)


class FixedTask(Task):
    """Rows with the given answers, in order (no reward of its own: the environment scores)."""

    def __init__(self, answers):
        examples = [Example([{"role": "user", "content": "Go."}], a) for a in answers]
        super().__init__(examples, examples)

    def sample_batch(self, step, size, seed=0):
        return self.train[:size]

    def score(self, completion, example):
        raise AssertionError("the environment scores")


class Broken(Guess):
    def __init__(self, where: str) -> None:
        self.where = where

    def reset(self, target: int = 3, **row) -> str:
        if self.where == "reset" and target == 1:
            raise RuntimeError("no board")
        return super().reset(target)

    def step(self, text: str):
        if self.where == "step" and self.target == 1:
            raise KeyError("lost state")
        return super().step(text)


@pytest.mark.parametrize("where", ["reset", "step"])
def test_an_environment_that_raises_is_a_counted_error_and_the_rollout_goes_on(where):
    task = FixedTask(["", ""])
    task.train = [
        Example(e.prompt, "", None, r) for e, r in zip(task.train, rows(1, 1), strict=True)
    ]
    task.train.append(Example(task.train[0].prompt, "", None, {"target": 1 + 1}))
    loop = AgentLoop(ScriptedBackend(counting_up), [], limits=AgentLimits(max_turns=3))
    evaluator = AgentEvaluator(task, loop, batch_size=3, environment=lambda: Broken(where))
    space = esbox.VectorSpace(np.arange(3.0))
    es = esbox.make_strategy("openai_es", space, seed=0, population=2, sigma=0.1)
    before = space.vector.copy()
    rewards = evaluator.evaluate(space, es.ask())
    assert np.array_equal(space.vector, before)
    assert rewards.tolist() == [pytest.approx(1 / 3)] * 2  # 0, 0 and the played game's 1
    failed, _, played = evaluator._step_trajectories[:3]
    assert failed.stop == "env_error" and failed.env_errors == 1 and failed.env_reward == 0.0
    assert where in failed.errors[-1] and played.stop == "done" and played.env_reward == 1.0
    metrics: dict = {}
    evaluator.add_metrics(None, metrics)
    assert metrics["agent_env_errors"] == 4.0  # two failed episodes for each of two members


# -- TextArena ---------------------------------------------------------------------------------
def test_sudoku_is_solved_by_its_own_moves_and_scores_the_share_done():
    game = TextArenaGame("Sudoku-v0", {"clues": 78, "max_turns": 10})
    first = game.reset(seed=5)
    assert "You are Player 0. You are playing Sudoku" in first and "R1" in first
    board = game._game.state.game_state["board"]
    empty = [(r, c) for r in range(9) for c in range(9) if board[r][c] == 0]
    full = game._game.full_grid
    assert len(empty) == 3 and game.reward() == 0.0
    (r, c) = empty[0]
    observation, done = game.step(f"I play [{r + 1} {c + 1} {full[r][c]}]")
    assert not done and "Board state" in observation and game.reward() == pytest.approx(1 / 3)
    for r, c in empty[1:]:
        observation, done = game.step(f"[{r + 1} {c + 1} {full[r][c]}]")
    assert done and "Congratulations" in observation and game.reward() == 1.0


def test_tower_of_hanoi_and_mastermind_end_with_their_own_rewards():
    hanoi = TextArenaGame("TowerOfHanoi-v0", {"num_disks": 2, "max_turns": 5})
    hanoi.reset(seed=0)
    for move in ("[A B]", "[A C]"):
        assert hanoi.step(move)[1] is False
    observation, done = hanoi.step("B C")  # no brackets: added, as TextArena's wrapper does
    assert done and hanoi.reward() == 1.0 and "solved" in observation
    mind = TextArenaGame("Mastermind-v0", {"code_length": 2, "num_numbers": 4, "max_turns": 2})
    mind.reset(seed=1)
    code = mind._game.state.game_state["secret_code"]
    wrong = [x for x in range(1, 5) if x not in code]
    assert mind.step(f"[{wrong[0]} {wrong[1]}]") == ("[GAME] Submitted "
        f"[{wrong[0]} {wrong[1]}]. Feedback: 0 black peg(s), 0 white peg(s).", False)  # fmt: skip
    assert mind.step(f"[{code[0]} {code[1]}]")[1] and mind.reward() == 1.0
    lights = TextArenaGame("LightsOut-v0", {"size": 3, "max_turns": 1})
    assert "Lights Out" in lights.reset(seed=2)
    assert lights.step("[0 0]")[1]  # its turn limit ends it, with its own share (may be < 0)
    assert lights.reward() == lights._game.close()[0][0] <= 1.0


def test_an_episode_seed_gives_the_same_game_whatever_runs_beside_it():
    a, b = TextArenaGame("Sudoku-v0", {"clues": 70}), TextArenaGame("Sudoku-v0", {"clues": 70})
    first = a.reset(seed=7)
    random.random()
    outer = random.getstate()
    TextArenaGame("Mastermind-v0").reset(seed=99)
    assert b.reset(seed=7) == first and TextArenaGame("Sudoku-v0").reset(seed=8) != first
    assert random.getstate() == outer  # nobody else's random stream moved


def sudoku_task(**extra):
    spec = {"kind": "textarena", "id": "Sudoku-v0", "kwargs": {"clues": 79, "max_turns": 4},
            "train_size": 6, "heldout_size": 2, **extra}  # fmt: skip
    return load_task(spec)


def test_every_member_of_a_step_plays_the_same_episodes():
    task = sudoku_task()
    loop = AgentLoop(ScriptedBackend(lambda p: "[1 1 1]"), [], limits=AgentLimits(max_turns=2))
    evaluator = AgentEvaluator(task, loop, batch_size=3, log_per_member=3)
    space = esbox.VectorSpace(np.zeros(2))
    es = esbox.make_strategy("openai_es", space, seed=0, population=4, sigma=0.1)
    es.tell(evaluator.evaluate(space, es.ask()))
    boards = [[r["messages"][0]["content"] for r in evaluator._records if r["member"] == m]
              for m in range(4)]  # fmt: skip
    assert boards[0] == boards[1] == boards[2] == boards[3]
    assert len(set(boards[0])) == 3 and "Game Board" in boards[0][0]
    evaluator.evaluate(space, es.ask())  # the next step: other episodes
    assert [r["messages"][0]["content"] for r in evaluator._records[:3]] != boards[0]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"id": "Sudoku-v9"}, "problem.task.id"),
        ({"id": "Wordle-v0"}, "NLTK"),
        ({"kwargs": {"clue": 70}}, "clues"),
        ({"kwargs": {"clues": 5}}, "problem.task.kwargs.clues"),
        ({"kwargs": {"max_turns": 0}}, "problem.task.kwargs.max_turns"),
    ],
)
def test_bad_game_ids_and_options_are_config_errors_naming_the_key(spec, named):
    base = {"kind": "textarena", "id": "Sudoku-v0", "train_size": 2, "heldout_size": 1}
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_task({**base, **spec})


# -- end to end: ES plays Sudoku on a tiny model -----------------------------------------------
@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=4096)


def run(model, out, task: str, agent: str | None, *extra: str):
    sets = {
        "problem.kind": "llm", "problem.model": str(model), "problem.batch_size": 2,
        "problem.task": task, "problem.validation_every": 2, "problem.validation_limit": 2,
        "options.population": 2, "options.sigma": 0.01, "budget.max_steps": 2,
    }  # fmt: skip
    if agent is not None:
        sets["problem.agent"] = agent
    args = ["optimize", "-q", "--strategy", "openai_es", "--out", str(out), *extra]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return CliRunner().invoke(cli, args, catch_exceptions=False)


SUDOKU = (
    "{kind: textarena, id: Sudoku-v0, kwargs: {clues: 79, max_turns: 3}, "
    "train_size: 8, heldout_size: 2}"
)
TURNS = "{tools: [], max_turns: 3, max_tokens: 36, max_new_tokens: 12}"


def test_the_sudoku_example_trains_with_es_and_logs_every_turn(tiny_lm, tmp_path):
    example = Path(__file__).parent.parent / "examples" / "agent-sudoku.yaml"
    sets = [
        f"problem.model={tiny_lm}", "problem.dtype=float32", "problem.batch_size=2",
        "problem.table_size=65536", "problem.chunk_size=65536", "problem.validation_limit=2",
        "problem.validation_every=2", "problem.task.train_size=8", "problem.task.heldout_size=2",
        "problem.agent.max_tokens=36", "problem.agent.max_new_tokens=12",
        "options.population=4", "options.subspaces=2", "budget.max_steps=2",
    ]  # fmt: skip
    args = ["optimize", "-q", "-c", str(example), "--out", str(tmp_path / "run")]
    result = invoke_cli(args, sets)
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(metrics) == 2 and "agent_env_reward" in metrics[0] and "val_env_reward" in metrics[1]
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").open()]
    first = records[0]
    assert first["messages"][0]["role"] == "system" and "[row column number]" in first["system"]
    assert "You are playing Sudoku" in first["messages"][1]["content"]
    assert first["turns"] == sum(m["role"] == "assistant" for m in first["messages"]) >= 1
    assert first["reward"] == first["env_reward"] and "<tools>" not in json.dumps(first)


def test_a_game_without_an_agent_section_or_with_bad_options_exits_2(tiny_lm, tmp_path):
    result = run(tiny_lm, tmp_path / "a", SUDOKU, None, "--dry-run")
    assert result.exit_code == 2 and "problem.agent" in result.output
    bad = SUDOKU.replace("clues: 79", "clues: 99")
    result = run(tiny_lm, tmp_path / "b", bad, TURNS, "--dry-run")
    assert result.exit_code == 2 and "problem.task.kwargs.clues" in result.output
    assert "[17, 80]" in result.output


def test_grpo_plays_the_game_through_the_same_loop_one_row_per_episode(tiny_lm, tmp_path):
    pytest.importorskip("trl")
    from esbox.adapters.rl import load_grpo_config
    from esbox.adapters.rl.training import GRPOTraining

    config = {
        "seed": 0,
        "problem": {
            "kind": "llm", "model": str(tiny_lm), "batch_size": 2, "validation_every": 0,
            "task": {"kind": "textarena", "id": "Sudoku-v0", "kwargs": {"clues": 79},
                     "train_size": 4, "heldout_size": 1},
            "agent": {"tools": [], "max_turns": 2, "max_tokens": 16, "max_new_tokens": 8},
        },
        "grpo": {"num_generations": 2, "learning_rate": 0.01, "gradient_checkpointing": False},
        "budget": {"max_steps": 1, "max_evaluations": None},
        "output": {"dir": str(tmp_path / "run")},
    }  # fmt: skip
    (tmp_path / "run").mkdir()
    built = GRPOTraining(load_grpo_config(config), tmp_path / "run")
    inputs = built.parts.inputs
    prompts = inputs.dataset["prompt"]
    assert len(set(prompts)) == 4 and all("Game Board" in p for p in prompts)  # one per seed
    rollouts = inputs.rollout_func
    assert sorted(rollouts.index.values()) == [0, 1, 2, 3]
    built.run(resume=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "agent_env_reward" in rows[0] and rows[0]["agent_turns"] >= 1.0


def test_a_missing_textarena_is_a_config_error_naming_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "textarena.envs.registration", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'esbox\[environments\]'"):
        load_task({"kind": "textarena", "id": "Sudoku-v0"})
