"""The agent loop and its evaluator: multi-turn tool use on a scripted backend, then end to end
through ``esbox optimize`` on a tiny model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from cli_runs import invoke_cli  # tests/cli_runs.py
from click.testing import CliRunner

import esbox
from esbox.adapters.agents.evaluator import AgentEvaluator, TrajectoryLog
from esbox.adapters.agents.loop import AgentLimits, AgentLoop, merge_system
from esbox.adapters.agents.tools import Calculator, ToolError, tool
from esbox.adapters.generation.backend import RenderedPrompt
from esbox.adapters.models.testing import char_tokenizer, save_tiny_lm
from esbox.adapters.tasks import ToolMathTask
from esbox.cli.main import cli

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "37 * 412"}}'


class ScriptedBackend:
    """A backend whose turn is ``policy(prompt text)``; records the prompts of every call."""

    def __init__(self, policy: Callable[[str], str]) -> None:
        self.tokenizer = char_tokenizer()
        self.policy = policy
        self.calls: list[list[str]] = []

    def generate(self, prompts, *, prefills=None, max_new_tokens=64, stop=None, **_):
        assert all(isinstance(p, RenderedPrompt) for p in prompts)
        assert stop == ["</tool_call>"]
        self.calls.append(list(prompts))
        prefills = prefills or [None] * len(prompts)
        pairs = zip(prompts, prefills, strict=True)  # the text after the prefill; a char a token
        return [self.policy(p + (f or ""))[:max_new_tokens] for p, f in pairs]


def call_then_answer(prompt: str) -> str:
    return CALL if "<tool_response>\n" not in prompt else "It is <answer>15244</answer>"


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_a_call_its_result_and_the_answer_make_one_trajectory():
    backend = ScriptedBackend(call_then_answer)
    (trajectory,) = AgentLoop(backend, [Calculator()]).run([user("What is 37 times 412?")])
    assert (trajectory.turns, trajectory.calls, trajectory.valid_calls) == (2, 1, 1)
    assert trajectory.final == "15244" and trajectory.stop == "answer"
    roles = [m["role"] for m in trajectory.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[2]["content"] == "15244"  # the calculator's exact answer
    assert "<tool_response>\n15244\n</tool_response>" in backend.calls[1][0]
    assert "<tools>" in backend.calls[0][0]  # the text protocol's system prompt, with schemas


def test_live_trajectories_share_each_call_and_finished_ones_drop_out():
    quick = "<answer>3</answer>"
    backend = ScriptedBackend(lambda p: quick if "quick" in p else call_then_answer(p))
    loop = AgentLoop(backend, [Calculator()])
    trajectories = loop.run([user("slow one"), user("quick one"), user("slow two")])
    assert [len(c) for c in backend.calls] == [3, 2]
    assert [t.turns for t in trajectories] == [2, 1, 2]
    assert [t.final for t in trajectories] == ["15244", "3", "15244"]


class GroupedBackend(ScriptedBackend):
    """A scripted backend that also takes ``groups`` (a low-rank population's members)."""

    def generate(self, prompts, *, groups=1, **kwargs):
        assert len(prompts) % groups == 0, "rows must split into equal groups"
        return super().generate(prompts, **kwargs)


def test_grouped_conversations_are_padded_to_equal_groups_and_end_as_ungrouped():
    quick = "<answer>3</answer>"
    policy = lambda p: quick if "quick" in p else call_then_answer(p)  # noqa: E731
    questions = [user(q) for q in ("slow 1", "quick 2", "slow 3", "quick 4", "quick 5", "slow 6")]
    grouped = GroupedBackend(policy)
    trajectories = AgentLoop(grouped, [Calculator()]).run(questions, groups=2)
    # turn 2: member 0 has two live rows, member 1 one, padded with a repeat of it
    assert [len(c) for c in grouped.calls] == [6, 4] and grouped.calls[1][2] == grouped.calls[1][3]
    alone = AgentLoop(ScriptedBackend(policy), [Calculator()]).run(questions)
    assert [t.to_dict() for t in trajectories] == [t.to_dict() for t in alone]
    with pytest.raises(ValueError, match="not 4 equal groups"):
        AgentLoop(grouped, [Calculator()]).run(questions, groups=4)


def test_turn_and_token_limits_end_a_trajectory_without_an_answer():
    always_call = ScriptedBackend(lambda p: CALL)
    (t,) = AgentLoop(always_call, [Calculator()], limits=AgentLimits(max_turns=3)).run([user("x")])
    assert (t.turns, t.calls, t.stop, t.final) == (3, 3, "max_turns", None)
    limits = AgentLimits(max_turns=9, max_tokens=100, max_new_tokens=80)
    (t,) = AgentLoop(always_call, [Calculator()], limits=limits).run([user("x")])
    assert t.stop == "max_tokens" and t.tokens <= 100 and t.turns == 2


def test_malformed_calls_go_back_to_the_model_and_are_counted():
    def policy(prompt: str) -> str:
        if "error:" in prompt:
            return "<answer>done</answer>"
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "1+"'  # truncated

    (t,) = AgentLoop(ScriptedBackend(policy), [Calculator()]).run([user("x")])
    assert (t.calls, t.valid_calls, t.invalid_calls) == (1, 0, 1)
    assert t.errors and t.messages[2]["content"].startswith("error:")
    assert t.final == "done"


@tool
def broken() -> str:
    """Always fails, as a buggy tool would."""
    raise RuntimeError("boom")


def test_a_failing_tool_is_a_tool_error_not_a_crash():
    def policy(prompt: str) -> str:
        return '<tool_call>{"name": "broken", "arguments": {}}' if "boom" not in prompt else "ok"

    (t,) = AgentLoop(ScriptedBackend(policy), [broken]).run([user("x")])
    assert (t.valid_calls, t.tool_errors, t.final) == (1, 1, "ok")


def test_a_prefill_opens_the_first_turn_only():
    def policy(prompt: str) -> str:
        if prompt.endswith('"expression": "'):
            return '37 * 412"}}'
        return "<answer>15244</answer>"

    opened = '<tool_call>{"name": "calculator", "arguments": {"expression": "'
    (t,) = AgentLoop(ScriptedBackend(policy), [Calculator()], prefill=opened).run([user("x")])
    assert (t.valid_calls, t.final) == (1, "15244")
    assert t.messages[1]["content"] == opened + '37 * 412"}}'


def test_a_list_of_prefills_opens_each_turn_in_order():
    opened = '<tool_call>{"name": "calculator", "arguments": {"expression": "'

    def policy(prompt: str) -> str:
        if prompt.endswith('"expression": "'):
            return '2 + 3"}}' if "<tool_response>\n" not in prompt else '5 * 4"}}'
        return "<answer>20</answer>"

    loop = AgentLoop(ScriptedBackend(policy), [Calculator()], prefill=[opened, opened, ""])
    (t,) = loop.run([user("x")])
    assert (t.turns, t.valid_calls, t.final) == (3, 2, "20")
    assert [m["content"] for m in t.messages[1:4:2]] == [opened + '2 + 3"}}', opened + '5 * 4"}}']
    assert t.messages[-1]["content"] == "<answer>20</answer>"  # the third turn: no prefill


def test_leading_system_messages_are_joined_for_the_tool_prompt():
    merged = merge_system(
        [{"role": "system", "content": "skill"}, {"role": "system", "content": "task"}, *user("q")]
    )
    assert merged == [{"role": "system", "content": "skill\n\ntask"}, *user("q")]


def small_task() -> ToolMathTask:
    return ToolMathTask(families=["product"], train_size=8, heldout_size=2, seed=1)


def test_agent_evaluator_scores_members_logs_trajectories_and_restores_weights(tmp_path):
    task = small_task()

    def policy(prompt: str) -> str:  # the right product for the question in the prompt
        question = next(e for e in task.train if e.prompt[-1]["content"] in prompt)
        a, b = question.meta["a"], question.meta["b"]
        if "<tool_response>\n" not in prompt:
            return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a}*{b}"}}}}'
        return f"<answer>{a * b}</answer>"

    loop = AgentLoop(ScriptedBackend(policy), [Calculator()])
    log = TrajectoryLog(tmp_path / "trajectories.jsonl")
    evaluator = AgentEvaluator(task, loop, batch_size=4, log=log, log_per_member=2)
    space = esbox.VectorSpace(np.zeros(5))
    es = esbox.make_strategy("openai_es", space, seed=0, population=4, sigma=0.1)
    before = space.vector.copy()
    rewards = evaluator.evaluate(space, es.ask())
    assert rewards.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert np.array_equal(space.vector, before)
    metrics: dict = {}
    evaluator.add_metrics(None, metrics)
    assert metrics["agent_tool_call_rate"] == 1.0 and metrics["agent_valid_call_rate"] == 1.0
    assert metrics["agent_turns"] == 2.0
    rows = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert len(rows) == 8 and {r["member"] for r in rows} == {0, 1, 2, 3}
    assert rows[0]["step"] == 0 and rows[0]["reward"] == 1.0 and rows[0]["final"] == rows[0]["gold"]
    evaluator.evaluate(space, es.ask())  # the same step again (a resumed run) replaces its lines
    assert len(log.path.read_text().splitlines()) == 8


def test_penalties_and_a_backend_error_leave_the_weights_as_they_were(tmp_path):
    task = small_task()
    loop = AgentLoop(ScriptedBackend(lambda p: CALL), [Calculator()], limits=AgentLimits(2))
    evaluator = AgentEvaluator(
        task, loop, batch_size=2, invalid_call_penalty=0.1, truncation_penalty=0.5
    )
    space = esbox.VectorSpace(np.arange(5.0))
    es = esbox.make_strategy("openai_es", space, seed=0, population=2, sigma=0.1)
    assert evaluator.evaluate(space, es.ask()).tolist() == [-0.5, -0.5]  # wrong, out of turns

    def failing(prompt: str) -> str:
        raise RuntimeError("the generation failed")

    loop.backend = ScriptedBackend(failing)
    evaluator.backend = loop.backend
    before = space.vector.copy()
    with pytest.raises(RuntimeError, match="generation failed"):
        evaluator.evaluate(space, es.ask())
    assert np.array_equal(space.vector, before)


def test_tool_errors_raised_as_tool_error_read_as_the_message():
    @tool
    def picky() -> str:
        """Refuses, with a reason the model reads."""
        raise ToolError("not today")

    def policy(prompt: str) -> str:
        return '<tool_call>{"name": "picky", "arguments": {}}' if "today" not in prompt else "fine"

    (t,) = AgentLoop(ScriptedBackend(policy), [picky]).run([user("x")])
    assert t.messages[2]["content"] == "error: not today" and t.tool_errors == 1


# -- end to end: the CLI on a tiny model ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=4096)


def agent_run(model: Path, out: Path, steps: int, *extra: str):
    sets = {
        "problem.kind": "llm",
        "problem.model": str(model),
        "problem.batch_size": 2,
        "problem.task": "{kind: tool_math, train_size: 20, heldout_size: 2}",
        "problem.agent": "{tools: [calculator], max_turns: 2, max_tokens: 48, max_new_tokens: 24}",
        "problem.validation_every": 2,
        "options.population": 4,
        "options.sigma": 0.01,
        "options.learning_rate": 0.001,
        "budget.max_steps": steps,
        "checkpoint.every": 1,
    }
    args = ["optimize", "-q", "--strategy", "openai_es", "--out", str(out)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return CliRunner().invoke(cli, [*args, *extra], catch_exceptions=False)


def test_optimize_with_an_agent_writes_trajectories_and_tool_metrics(tiny_lm, tmp_path):
    result = agent_run(tiny_lm, tmp_path / "run", steps=2)
    assert result.exit_code == 0, result.output
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in metrics]
    assert len(rows) == 2 and "agent_tool_call_rate" in rows[0] and "val_accuracy" in rows[1]
    trajectories = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    first = json.loads(trajectories[0])
    assert len(trajectories) == 2 * 4 and first["messages"][0]["role"] == "user"
    assert {"turns", "tokens", "calls", "valid_calls", "final", "reward"} <= set(first)


def test_a_bad_agent_section_is_a_config_error_naming_the_key(tiny_lm, tmp_path):
    result = agent_run(tiny_lm, tmp_path / "bad", 1, "--set", "problem.agent={tools: [browser]}")
    assert result.exit_code == 2 and "problem.agent.tools" in result.output
    result = agent_run(tiny_lm, tmp_path / "bad2", 1, "--set", "problem.agent={max_turn: 3}")
    assert result.exit_code == 2 and "max_turn" in result.output and "max_turns" in result.output
    result = agent_run(tiny_lm, tmp_path / "bad3", 1, "--set", "problem.agent={prefill: [a, 3]}")
    assert result.exit_code == 2 and "problem.agent.prefill" in result.output
    assert "list of strings" in result.output


def test_an_agent_run_resumes_bit_identically_with_its_trajectories(tiny_lm, tmp_path):
    from safetensors.torch import load_file

    assert agent_run(tiny_lm, tmp_path / "straight", steps=3).exit_code == 0
    assert agent_run(tiny_lm, tmp_path / "split", steps=2).exit_code == 0
    resumed = CliRunner().invoke(
        cli, ["resume", "-q", str(tmp_path / "split"), "--set", "budget.max_steps=3"]
    )
    assert resumed.exit_code == 0, resumed.output
    a = load_file(str(tmp_path / "straight" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    lines = [(tmp_path / d / "trajectories.jsonl").read_text() for d in ("straight", "split")]
    assert lines[0] == lines[1]


def test_trajectories_prints_a_logged_conversation(tiny_lm, tmp_path):
    assert agent_run(tiny_lm, tmp_path / "run", steps=2).exit_code == 0
    shown = CliRunner().invoke(
        cli, ["trajectories", str(tmp_path / "run"), "--member", "2", "--system"]
    )
    assert shown.exit_code == 0, shown.output
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    record = next(r for r in map(json.loads, lines) if r["step"] == 1 and r["member"] == 2)
    assert "== step 1 member 2" in shown.output and f"gold {record['gold']!r}" in shown.output
    assert "-- user" in shown.output and "calculator" in shown.output  # the tool prompt
    missing = CliRunner().invoke(cli, ["trajectories", str(tmp_path / "run"), "--step", "9"])
    assert missing.exit_code == 2 and "logged: steps 0..1" in missing.output
    indexed = CliRunner().invoke(cli, ["trajectories", str(tmp_path / "run"), "--index", "0"])
    assert indexed.exit_code == 2 and "--step and --member" in indexed.output
    nothing = CliRunner().invoke(cli, ["trajectories", str(tmp_path)])
    assert nothing.exit_code == 2 and "problem.agent" in nothing.output


def test_the_agent_example_config_runs_on_a_tiny_model(tiny_lm, tmp_path):
    example = Path(__file__).parent.parent / "examples" / "agent-math.yaml"
    sets = [
        f"problem.model={tiny_lm}", "problem.dtype=float32", "problem.batch_size=2",
        "problem.table_size=65536", "problem.chunk_size=65536", "problem.validation_limit=2",
        "problem.task={kind: tool_math, train_size: 8, heldout_size: 2}",
        "options.population=4", "options.subspaces=2", "budget.max_steps=1",
    ]  # fmt: skip
    args = ["optimize", "-q", "-c", str(example), "--out", str(tmp_path / "run")]
    result = invoke_cli(args, sets)
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    assert record["messages"][1]["content"].startswith('<tool_call>{"name": "calculator"')
