"""Issue 28, parts 3-4: reasoning-gym datasets as a task (scored by each dataset's own
``score_answer``, single-turn and with tools) and the chain task whose horizon is a knob."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from cli_runs import invoke_cli  # tests/cli_runs.py
from click.testing import CliRunner

import esbox
from esbox.adapters.agents.evaluator import AgentEvaluator
from esbox.adapters.agents.loop import AgentLimits, AgentLoop
from esbox.adapters.agents.tools import Calculator
from esbox.adapters.generation.backend import RenderedPrompt
from esbox.adapters.models.testing import char_tokenizer, save_tiny_lm
from esbox.adapters.tasks.chain import MAX_HORIZON, ToolChainTask
from esbox.adapters.tasks.loading import load_task
from esbox.cli.main import cli
from esbox.errors import ConfigError


class ScriptedBackend:
    def __init__(self, policy) -> None:
        self.tokenizer = char_tokenizer()
        self.policy = policy

    def generate(self, prompts, *, max_new_tokens=64, **_):
        assert all(isinstance(p, RenderedPrompt) for p in prompts)
        return [self.policy(p) for p in prompts]


def question(example) -> str:
    return example.prompt[-1]["content"]


# -- the chain task ------------------------------------------------------------------------------
STEP = re.compile(r"(add|subtract|multiply by) (\d+)")


def apply(wording: str, value: int) -> int:
    op, n = STEP.fullmatch(wording).groups()
    return value + int(n) if op == "add" else value - int(n) if op == "subtract" else value * int(n)


def solve(text: str) -> list[int]:
    """The chain's values, worked out from the question's words alone."""
    values = [int(re.match(r"Start with (-?\d+)\.", text).group(1))]
    for step in re.findall(r"Step \d+: (.*?)\.(?= Step| What)", text):
        branch = re.fullmatch(r"if the result is even, (.*); if it is odd, (.*)", step)
        wording = step if branch is None else branch.group(1 + values[-1] % 2)
        values.append(apply(wording, values[-1]))
    return values


@pytest.mark.parametrize("branching", [False, True])
def test_each_horizon_has_that_many_dependent_steps_and_the_right_answer(branching):
    for h in range(1, MAX_HORIZON + 1):
        task = ToolChainTask(horizon=h, branching=branching, train_size=30, heldout_size=5)
        assert task.name == f"tool_chain/h{h}"
        held = {question(e) for e in task.heldout}
        assert not held & {question(e) for e in task.train}
        for example in task.train + task.heldout:
            text = question(example)
            assert text.count("Step ") == h and solve(text) == example.meta["values"]
            assert example.answer == str(example.meta["values"][-1])
            assert task.score(f"<answer>{example.answer}</answer>", example) == 1.0
            assert task.score(str(int(example.answer) + 1), example) == 0.0
        if branching and h > 1:
            assert all("if the result is even" in question(e) for e in task.train)


def test_progress_credit_pays_for_intermediate_results_but_success_stays_the_final_number():
    task = ToolChainTask(horizon=4, train_size=3, heldout_size=0, progress_credit=0.5)
    example = task.train[0]
    values = example.meta["values"]
    assert task.reward(f"<answer>{values[-1]}</answer>", example) == 1.0
    assert task.reward(f"<answer>{values[2]}</answer>", example) == 0.5 * 2 / 4
    assert task.reward(f"<tool_response>\n{values[3]}\n</tool_response>", example) == 0.5 * 3 / 4
    for text in (f"<answer>{values[0]}</answer>", "<answer>12345678</answer>", ""):
        assert task.reward(text, example) == 0.0  # the start value is in the question
    assert not task.is_correct(f"<answer>{values[3]}</answer>", example)
    plain = ToolChainTask(horizon=4, train_size=3, heldout_size=0)
    assert plain.reward(f"<answer>{values[3]}</answer>", plain.train[0]) == 0.0  # off by default
    for bad in (1.0, -0.1, "0.5"):
        with pytest.raises(ConfigError, match=r"problem\.task\.progress_credit .*\[0, 1\)"):
            load_task({"kind": "tool_chain", "progress_credit": bad})


@pytest.mark.parametrize("horizon", [0, 9, 2.5, True])
def test_a_horizon_out_of_range_names_the_key_and_the_range(horizon):
    with pytest.raises(ConfigError, match=r"problem\.task\.horizon .*\[1, 8\]"):
        load_task({"kind": "tool_chain", "horizon": horizon})


def test_an_agent_that_calls_once_a_step_solves_the_chain_in_h_calls():
    task = ToolChainTask(horizon=4, train_size=3, heldout_size=1)

    def policy(prompt: str) -> str:  # one call a step, each on the previous result
        example = next(e for e in task.train if question(e) in prompt)
        results = re.findall(r"<tool_response>\n(-?\d+)\n</tool_response>", prompt)
        value = int(results[-1]) if results else example.meta["values"][0]
        steps = re.findall(r"Step \d+: (.*?)\.(?= Step| What)", question(example))
        if len(results) == len(steps):
            return f"<answer>{value}</answer>"
        op, n = STEP.fullmatch(steps[len(results)]).groups()
        expression = f"{value} {'+' if op == 'add' else '-' if op == 'subtract' else '*'} {n}"
        call = {"name": "calculator", "arguments": {"expression": expression}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    loop = AgentLoop(ScriptedBackend(policy), [Calculator()], limits=AgentLimits(max_turns=5))
    evaluator = AgentEvaluator(task, loop, batch_size=3)
    trajectories = evaluator.run(task.train, 0, None)
    assert [t.valid_calls for t in trajectories] == [4, 4, 4]
    assert [t.reward for t in trajectories] == [1.0, 1.0, 1.0]


# -- reasoning-gym ------------------------------------------------------------------------------
@pytest.fixture
def rg():
    return pytest.importorskip("reasoning_gym")


ARITH = {"kind": "reasoning_gym", "name": "basic_arithmetic", "size": 6, "heldout_size": 2,
         "seed": 3, "config": {"min_terms": 2, "max_terms": 3}}  # fmt: skip


def test_questions_are_the_dataset_s_and_scored_by_its_own_score_answer(rg):
    task = load_task(ARITH)
    data = rg.create_dataset("basic_arithmetic", size=8, seed=3, min_terms=2, max_terms=3)
    assert (len(task.train), len(task.heldout), task.name) == (
        6,
        2,
        "reasoning_gym/basic_arithmetic",
    )
    for example, entry in zip(task.heldout + task.train, data, strict=True):
        assert question(example).startswith(entry["question"]) and example.answer == entry["answer"]
        for reply in (entry["answer"], "12345", ""):
            wanted = data.score_answer(reply, entry)
            assert task.score(f"So <answer>{reply}</answer>", example) == wanted
    spell = load_task(
        {"kind": "reasoning_gym", "name": "spell_backward", "size": 2, "heldout_size": 1}
    )
    example = spell.train[0]
    assert spell.score(f"<answer>{example.answer}</answer>", example) == 1.0


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"name": "basic_arithmetics"}, "basic_arithmetic"),
        ({"config": {"min_term": 2}}, "min_terms"),
        ({"config": {"min_terms": 5, "max_terms": 2}}, "problem.task.config"),
        ({"size": 0}, "problem.task.size"),
    ],
)
def test_bad_reasoning_gym_input_names_the_key(rg, spec, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_task({**ARITH, **spec})


def test_a_reasoning_gym_task_with_a_calculator_agent(rg):
    task = load_task(ARITH)

    def policy(prompt: str) -> str:
        if "<tool_response>\n" in prompt:  # the result came back
            return f"<answer>{prompt.rsplit('<tool_response>', 1)[1].split()[0]}</answer>"
        expression = re.search(r"Calculate (.*?)\.\n", prompt.rsplit("user", 1)[1]).group(1)
        call = {"name": "calculator", "arguments": {"expression": expression.replace(" = ?", "")}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    loop = AgentLoop(ScriptedBackend(policy), [Calculator()])
    evaluator = AgentEvaluator(task, loop, batch_size=4)
    space = esbox.VectorSpace(np.zeros(2))
    es = esbox.make_strategy("openai_es", space, seed=0, population=2, sigma=0.1)
    assert evaluator.evaluate(space, es.ask()).tolist() == [1.0, 1.0]


def test_esbox_tasks_lists_the_names(rg):
    shown = CliRunner().invoke(cli, ["tasks", "reasoning_gym"])
    assert shown.exit_code == 0 and "basic_arithmetic" in shown.output.split()
    assert "tool_chain" in CliRunner().invoke(cli, ["tasks"]).output


def test_a_single_turn_reasoning_gym_run_on_a_tiny_model(rg, tmp_path):
    model = save_tiny_lm(tmp_path / "tiny")
    sets = {"problem.kind": "llm", "problem.model": str(model), "problem.batch_size": 2,
            "problem.max_new_tokens": 8, "problem.task": json.dumps(ARITH),
            "options.population": 2, "budget.max_steps": 1}  # fmt: skip
    args = ["optimize", "-q", "--strategy", "openai_es", "--out", str(tmp_path / "run")]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1


def test_the_reasoning_gym_example_runs_as_an_agent_task(rg, tmp_path):
    example = Path(__file__).parent.parent / "examples" / "agent-reasoning-gym.yaml"
    model = save_tiny_lm(tmp_path / "tiny", max_position_embeddings=4096)
    sets = [
        f"problem.model={model}", "problem.dtype=float32", "problem.batch_size=2",
        "problem.table_size=65536", "problem.chunk_size=65536", "problem.validation_every=0",
        "problem.task.size=6", "problem.task.heldout_size=2", "problem.agent.max_tokens=24",
        "problem.agent.max_new_tokens=12", "options.population=4", "options.subspaces=2",
        "budget.max_steps=1",
    ]  # fmt: skip
    args = ["optimize", "-q", "-c", str(example), "--out", str(tmp_path / "run")]
    result = invoke_cli(args, sets)
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    assert record["question"].startswith("Calculate ") and "calculator" in record["system"]
