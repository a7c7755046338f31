"""``esbox evaluate RUN_DIR ...``: trained runs (ES and GRPO) and their base model side by side on
tiny models — the same questions as ``--model`` evaluations, paired changes, disagreeing runs
refused naming the key, an agent task with its tool-use figures and trajectory files."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import zlib
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import yaml
from click.testing import CliRunner

from esbox.adapters.models.testing import save_tiny_lm
from esbox.adapters.tasks.arithmetic import ArithmeticTask
from esbox.adapters.tasks.paired import paired_change, standard_error
from esbox.cli.main import cli

TASK = {"kind": "arithmetic", "train_size": 8, "heldout_size": 16}


@pytest.fixture(scope="module", autouse=True)
def coin_score():
    """A random model's completions right or wrong by a hash of their text, so that models
    differ question by question (the real grader gives a random model 0 everywhere)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ArithmeticTask, "score", lambda self, c, e: float(zlib.crc32(c.encode()) % 2))
        yield


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-llama")


def invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def es_run(model: Path, out: Path, strategy: str) -> Path:
    """One ES step with a large learning rate (the model moves)."""
    sets = {
        "problem.kind": "llm", "problem.model": str(model), "problem.batch_size": 2,
        "problem.task": json.dumps(TASK),
        "problem.validation_every": 0, "options.population": 4, "options.sigma": 0.5,
        "options.learning_rate": 2.0, "budget.max_steps": 1, "budget.max_evaluations": "null",
    }  # fmt: skip
    if strategy == "copes":
        sets["options.subspaces"] = 2
    args = ["optimize", "-q", "--strategy", strategy, "--out", out]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def two_runs(tiny_lm, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    return es_run(tiny_lm, root / "copes", "copes"), es_run(tiny_lm, root / "oes", "openai_es")


def table_lines(result) -> list[str]:
    """The table's lines on stdout (model loading writes progress bars to stderr)."""
    return result.stdout.splitlines()


def single(model: Path, *args: str) -> dict:
    """The figures of ``esbox evaluate --model`` with the runs' task."""
    out = model.parent / f"{model.parent.name}-single.json"
    result = invoke("evaluate", "--model", model, "--task", json.dumps(TASK), "--out", out, *args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_paired_se_is_the_se_of_the_per_question_differences():
    base = [True, True, False, False, True, False, True, False]
    other = [True, True, True, False, True, False, True, True]  # 2 gained, none lost
    change = paired_change(base, other)
    assert change["change"] == pytest.approx(0.25) and (change["gained"], change["lost"]) == (2, 0)
    differences = [int(b) - int(a) for a, b in zip(base, other, strict=True)]
    assert change["change_se"] == pytest.approx(statistics.stdev(differences) / math.sqrt(8))
    unpaired = math.hypot(standard_error(base), standard_error(other))
    assert change["change_se"] < 0.7 * unpaired  # the shared questions' variance is gone
    assert math.isnan(standard_error([1.0])) and standard_error([0.0, 1.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="same questions"):
        paired_change(base, other[:-1])


def test_two_runs_and_base_side_by_side_as_single_evaluations_score_them(
    tiny_lm, two_runs, tmp_path
):
    copes, oes = two_runs
    out = tmp_path / "compare.json"
    result = invoke("evaluate", copes, oes, "--base", "--samples", "2", "--out", out)
    assert result.exit_code == 0, result.output
    lines = table_lines(result)
    assert lines[0].startswith("| model | n | accuracy (SE) | vs base, points (paired SE) |")
    assert "pass@2" in lines[0] and [line.split(" | ")[0] for line in lines[2:]] == [
        "| base", f"| {copes}", f"| {oes}"]  # fmt: skip
    record = json.loads(out.read_text())
    assert record["reference"] == "base" and record["samples"] == 2
    assert record["problem"]["task"] == TASK and record["dtype"] == "float32"
    base, *trained = record["models"]
    assert base["model"] == str(tiny_lm) and [m["run"] for m in trained] == [str(copes), str(oes)]
    # each model as esbox evaluate --model scores it alone: same questions, same sampling
    for entry in record["models"]:
        alone = single(Path(entry["model"]), "--samples", "2")
        for key in ("accuracy", "mean_reward", "pass@2", "n"):
            assert entry[key] == alone[key], (entry["name"], key)
        assert entry["n"] == len(entry["correct"]) == 16
        assert entry["accuracy"] == pytest.approx(sum(entry["correct"]) / 16)
    assert base["vs_reference"] is None
    differ = 0
    for entry in trained:
        pairs = list(zip(base["correct"], entry["correct"], strict=True))
        differences = [int(b) - int(a) for a, b in pairs]
        change = entry["vs_reference"]
        assert change["against"] == "base"
        assert change["change"] == pytest.approx(entry["accuracy"] - base["accuracy"])
        assert change["change_se"] == pytest.approx(statistics.stdev(differences) / 4)
        assert (change["gained"], change["lost"]) == (differences.count(1), differences.count(-1))
        differ += any(differences)
    assert differ  # the trained models answer some questions differently from the base


def test_without_base_the_first_run_is_the_reference(two_runs):
    copes, oes = two_runs
    result = invoke("evaluate", oes, copes, "--limit", "5")
    assert result.exit_code == 0, result.output
    header, _, first, second = table_lines(result)
    assert f"vs {oes}, points (paired SE)" in header and "pass@2" not in header
    assert first.startswith(f"| {oes} | 5 |") and " | — | — |" in first
    assert second.startswith(f"| {copes} | 5 |") and " / " in second


def copy_run(run: Path, out: Path, **problem) -> Path:
    """A copy of ``run`` whose config.yaml has ``problem`` changed."""
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("checkpoints"))
    config = yaml.safe_load((out / "config.yaml").read_text())
    config["problem"].update(problem)
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    return out


def test_runs_that_disagree_exit_2_naming_the_key(two_runs, tmp_path):
    copes, _ = two_runs
    other = copy_run(copes, tmp_path / "fewer", task={**TASK, "heldout_size": 8})
    result = invoke("evaluate", copes, other)
    assert result.exit_code == 2
    assert f"problem.task.heldout_size differs: {copes} has 16, {other} has 8" in result.output
    added = copy_run(copes, tmp_path / "digits", task={**TASK, "digits": 3})
    result = invoke("evaluate", copes, added)
    assert result.exit_code == 2
    assert f"problem.task.digits differs: {copes} leaves it unset, {added} has 3" in result.output
    for key, value in [("dtype", "bfloat16"), ("max_new_tokens", 5), ("model", "elsewhere"),
                       ("agent", {"tools": ["calculator"]})]:  # fmt: skip
        changed = copy_run(copes, tmp_path / key, **{key: value})
        result = invoke("evaluate", copes, changed)
        assert result.exit_code == 2 and f"problem.{key}" in result.output, (key, result.output)
    # --dtype scores every model in one dtype, so the runs' dtypes may differ
    bf16 = tmp_path / "dtype"
    assert invoke("evaluate", copes, bf16, "--dtype", "float32", "--limit", "2").exit_code == 0


def test_flag_errors_exit_2(two_runs, tmp_path):
    copes, _ = two_runs
    cases = [
        ([copes, "--task", "arithmetic"], "--task with RUN_DIRs"),
        ([copes, "--model", "smollm2"], "--model with RUN_DIRs"),
        ([copes, "--max-new-tokens", "4"], "--max-new-tokens with RUN_DIRs"),
        (["--base"], "--base adds the start model of RUN_DIRs"),
        ([], "give --model MODEL, or run directories"),
        ([copes, "--trajectories", tmp_path / "t"], "the runs have no problem.agent"),
        ([tmp_path], "has no config.yaml"),
    ]
    for args, expected in cases:
        result = invoke("evaluate", *args)
        assert result.exit_code == 2 and expected in result.output, (args, result.output)
    unfinished = copy_run(copes, tmp_path / "unfinished")
    shutil.rmtree(unfinished / "model")
    result = invoke("evaluate", unfinished)
    assert result.exit_code == 2 and "has no trained model/" in result.output


def test_an_es_run_and_a_grpo_run_side_by_side(tiny_lm, two_runs, tmp_path):
    pytest.importorskip("trl")
    copes, _ = two_runs
    config = {
        "seed": 0,
        "problem": {"kind": "llm", "model": str(tiny_lm), "task": TASK, "batch_size": 2,
                    "validation_every": 0},
        "grpo": {"num_generations": 2, "learning_rate": 0.05, "gradient_checkpointing": False},
        "budget": {"max_steps": 1, "max_evaluations": None},
    }  # fmt: skip
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    grpo = tmp_path / "grpo-run"
    assert invoke("grpo", "-q", "-c", path, "--out", grpo).exit_code == 0
    out = tmp_path / "compare.json"
    result = invoke("evaluate", grpo, copes, "--base", "--limit", "6", "--out", out)
    assert result.exit_code == 0, result.output
    models = {m["name"]: m for m in json.loads(out.read_text())["models"]}
    assert list(models) == ["base", str(grpo), str(copes)]
    for name in (str(grpo), str(copes)):
        alone = single(Path(models[name]["model"]), "--limit", "6")
        assert models[name]["accuracy"] == alone["accuracy"] and models[name]["n"] == 6


AGENT = {"tools": ["calculator"], "max_turns": 2, "max_tokens": 24, "max_new_tokens": 8,
            "prefill": '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}'
                       "</tool_call>"}  # fmt: skip
TOOL_TASK = {"kind": "tool_math", "families": ["product"], "train_size": 4, "heldout_size": 3}


def test_agent_runs_report_tool_use_and_write_each_models_trajectories(two_runs, tmp_path):
    # the ES-trained model of a run directory whose config says: tool math with a calculator
    run = copy_run(two_runs[0], tmp_path / "agent-copes", task=TOOL_TASK, agent=AGENT)
    trajectories, out = tmp_path / "trajectories", tmp_path / "agent.json"
    result = invoke("evaluate", run, "--base", "--trajectories", trajectories, "--out", out)
    assert result.exit_code == 0, result.output
    header = table_lines(result)[0]
    for key in ("tool_call_rate", "valid_call_rate", "answer_rate", "turns", "tool_errors"):
        assert key in header
    record = json.loads(out.read_text())
    assert record["problem"]["agent"]["tools"] == ["calculator"]
    assert [m["tool_call_rate"] for m in record["models"]] == [1.0, 1.0]  # the prefilled call
    assert sorted(p.name for p in trajectories.iterdir()) == ["agent-copes.jsonl", "base.jsonl"]
    for entry, name in zip(record["models"], ["base", "agent-copes"], strict=True):
        lines = [json.loads(x) for x in (trajectories / f"{name}.jsonl").read_text().splitlines()]
        assert len(lines) == 3 and [r["correct"] for r in lines] == entry["correct"]
        assert lines[0]["messages"][2]["content"] == "42"  # the calculator's answer, read back
    alone = tmp_path / "alone.jsonl"
    scored = invoke("evaluate", "--model", run / "model", "--task", json.dumps(TOOL_TASK),
                    "--agent", json.dumps(AGENT), "--trajectories", alone)  # fmt: skip
    assert scored.exit_code == 0, scored.output
    assert alone.read_text() == (trajectories / "agent-copes.jsonl").read_text()
    shown = invoke("trajectories", alone, "--index", 1)  # the held-out conversation, readable
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("== question 1 sample 0: gold ")
    assert "-- tool\n42\n" in shown.output
    assert f"correct {lines[1]['correct']}" in shown.output and "question 0" not in shown.output
    missing = invoke("trajectories", alone, "--index", 7)
    assert missing.exit_code == 2 and "(logged: questions 0..2)" in missing.output
    wrong = invoke("trajectories", tmp_path, "--index", 0)
    assert wrong.exit_code == 2 and "does not exist" in wrong.output
