"""GSM8K-style math with the python tool as an evaluation: ``evaluate_agent`` on a scripted
backend, and ``esbox evaluate --agent`` on a tiny model. The data is a few rows written here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from click.testing import CliRunner

from esbox.adapters.agents.config import agent_options, build_agent
from esbox.adapters.agents.evaluator import evaluate_agent, trajectory_records
from esbox.adapters.generation.backend import RenderedPrompt
from esbox.adapters.models.testing import char_tokenizer, save_tiny_lm
from esbox.adapters.tasks import MathTask
from esbox.cli.main import cli

ROWS = [  # GSM8K's form: the worked solution ends with "#### <final answer>"
    {"question": "Tom has 12 apples and buys 30 more. How many?", "answer": "12+30=42\n#### 42"},
    {"question": "A box holds 7 rows of 8 eggs. How many eggs?", "answer": "7*8=56\n#### 56"},
    {"question": "Ann saves 1,200 dollars a month for 2 months.", "answer": "#### 2,400"},
]
SUMS = {"Tom": "12 + 30", "A box": "7 * 8", "Ann": "1200 * 2"}


class ScriptedBackend:
    """A backend whose turn is ``policy(prompt text)`` (a character is a token)."""

    def __init__(self, policy: Callable[[str], str]) -> None:
        self.tokenizer = char_tokenizer()
        self.policy = policy
        self.seeds: list[int | None] = []

    def generate(self, prompts, *, prefills=None, max_new_tokens=64, seed=None, **_):
        assert all(isinstance(p, RenderedPrompt) for p in prompts)
        self.seeds.append(seed)
        prefills = prefills or [None] * len(prompts)
        pairs = zip(prompts, prefills, strict=True)
        return [self.policy(p + (f or ""))[:max_new_tokens] for p, f in pairs]


def python_then_answer(prompt: str) -> str:
    """Writes a program for the question, then answers with what it printed (wrong for Ann)."""
    if "<tool_response>\n" not in prompt:
        expression = next(v for k, v in SUMS.items() if k in prompt)
        code = json.dumps(f"print({expression})")
        return f'<tool_call>{{"name": "python", "arguments": {{"code": {code}}}}}</tool_call>'
    printed = prompt.rsplit("<tool_response>\n", 1)[1].split("\n", 1)[0]
    return f"<answer>{printed}</answer>" if "Ann" not in prompt else "<answer>24</answer>"


def gsm8k_task() -> MathTask:
    return MathTask(ROWS, ROWS, instruction="", use_math_verify=False)


def test_evaluate_agent_scores_gsm8k_answers_from_python_tool_results():
    task = gsm8k_task()
    assert [e.answer for e in task.heldout] == ["42", "56", "2400"]  # "#### 2,400" reduced
    options = agent_options({"tools": ["python"], "max_turns": 3})
    parts = build_agent(
        options, task, ScriptedBackend(python_then_answer), seed=0, batch_size=2, greedy=True,
        validation=None,
    )  # fmt: skip
    seen: list[int] = []
    figures, trajectories = evaluate_agent(
        parts.evaluator, task.heldout, batch_size=2, progress=seen.append
    )
    assert seen == [2, 1]
    assert figures["accuracy"] == pytest.approx(2 / 3) and figures["pass@1"] == figures["accuracy"]
    assert figures["n"] == 3.0 and figures["mean_reward"] == pytest.approx(2 / 3)
    assert figures["tool_call_rate"] == 1.0 and figures["valid_call_rate"] == 1.0
    assert (figures["turns"], figures["tool_errors"], figures["answer_rate"]) == (2.0, 0.0, 1.0)
    first = trajectories[0][0]
    assert first.messages[2] == {"role": "tool", "name": "python", "content": "42"}  # sandboxed
    records = trajectory_records(task, parts.evaluator.loop, task.heldout, trajectories)
    assert [r["correct"] for r in records] == [True, True, False]
    assert records[2]["gold"] == "2400" and records[2]["final"] == "24"
    assert "<tools>" in records[0]["system"] and json.dumps(records)  # JSON-ready


def test_a_failing_program_is_a_tool_error_and_samples_give_pass_at_k():
    def crash_then_answer(prompt: str) -> str:
        if "<tool_response>\n" not in prompt:
            return '<tool_call>{"name": "python", "arguments": {"code": "1/0"}}</tool_call>'
        return "<answer>42</answer>"

    task = gsm8k_task()
    options = agent_options({"tools": ["python"], "max_turns": 2})
    backend = ScriptedBackend(crash_then_answer)
    parts = build_agent(options, task, backend, seed=3, batch_size=4, greedy=False, validation=None)
    figures, trajectories = evaluate_agent(parts.evaluator, task.heldout[:2], num_samples=2)
    assert figures["tool_errors"] == 4.0 and figures["valid_call_rate"] == 1.0
    assert "ZeroDivisionError" in trajectories[0][0].messages[2]["content"]
    assert figures["accuracy"] == 0.5 and figures["pass@2"] == 0.5 and figures["n"] == 2.0
    assert len(set(backend.seeds)) == 4  # every turn of every sample seeded apart


# -- the CLI on a tiny model ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=4096)


@pytest.fixture
def gsm8k_files(tmp_path) -> str:
    for name in ("train", "test"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    return f"{{kind: math, path: {train}, heldout_path: {test}}}"


def evaluate(model: Path, task: str, *args: str):
    base = ["evaluate", "--model", str(model), "--task", task, "--threads", "1"]
    return CliRunner().invoke(cli, [*base, *args], catch_exceptions=False)


def test_evaluate_with_the_python_tool_prints_tool_use_and_writes_trajectories(
    tiny_lm, gsm8k_files, tmp_path
):
    # the random model never calls a tool by itself: the first turn starts with a whole call
    opened = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    agent = {"tools": ["python"], "max_turns": 2, "max_tokens": 40, "max_new_tokens": 16,
             "prefill": opened}  # fmt: skip
    out, log = tmp_path / "figures.json", tmp_path / "trajectories.jsonl"
    result = evaluate(
        tiny_lm, gsm8k_files, "--agent", json.dumps(agent), "--limit", "2",
        "--out", str(out), "--trajectories", str(log),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for key in ("accuracy", "tool_call_rate", "valid_call_rate", "turns", "tool_errors"):
        assert f"| {key} |" in result.output
    assert "python tool:" in result.output and "sandbox" in result.output  # what isolates it
    figures = json.loads(out.read_text())
    assert figures["agent"]["tools"] == ["python"] and figures["n"] == 2.0
    assert figures["tool_call_rate"] == 1.0 and figures["valid_call_rate"] == 1.0
    assert figures["turns"] == 2.0  # the call, then a turn that ends the trajectory
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["gold"] for r in records] == ["42", "56"]
    assert records[0]["messages"][2] == {"role": "tool", "name": "python", "content": "42"}


def test_evaluate_agent_flag_errors_exit_2_before_the_model_loads(tiny_lm, gsm8k_files):
    cases = [
        (["--agent", "{tools: [browser]}"], "tools"),
        (["--agent", "{max_turn: 3}"], "max_turns"),
        (["--agent", "{tools: [python]", "--limit", "1"], "not valid YAML"),
        (["--agent", "python", "--max-new-tokens", "8"], "max_new_tokens"),
        (["--trajectories", "t.jsonl"], "--trajectories needs --agent"),
    ]
    for args, expected in cases:
        result = evaluate(Path("no-such-model"), gsm8k_files, *args)
        assert result.exit_code == 2 and expected in result.output, (args, result.output)
    raw = "{kind: arithmetic, chat: false, heldout_size: 2, train_size: 4}"
    result = evaluate(tiny_lm, raw, "--agent", "calculator")
    assert result.exit_code == 2 and "chat prompts" in result.output
