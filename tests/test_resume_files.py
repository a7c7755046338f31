"""A run killed with SIGKILL and resumed (or a finished run extended) writes the same files as a
run that never stopped: every file of the two run directories is compared, bytes unless it is
JSON, JSONL or YAML, where only the clock and path fields of ``IGNORED`` may differ."""

from __future__ import annotations

import inspect
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch
import yaml
from click.testing import CliRunner
from run_files import assert_same_files, report_table  # tests/run_files.py

import esbox
from esbox.adapters.models.testing import save_tiny_lm
from esbox.adapters.tasks.base import Task
from esbox.checkpoint import latest_checkpoint
from esbox.cli.main import cli
from esbox.errors import RewardError
from esbox.evaluation import FunctionEvaluator
from esbox.runner import Budget, Runner
from esbox.space import VectorSpace

# The fields that may differ between the two runs, per file (dotted keys): clocks and paths.
STEP_CLOCKS = {"wall_seconds", "cpu_seconds", "peak_rss_mib"}  # measured, not computed
IGNORED = {
    "summary.json": {"wall_seconds", "evaluations_per_second", "resumed", "run_dir", "model"},
    "metrics.jsonl": STEP_CLOCKS,
    "checkpoints/history.jsonl": STEP_CLOCKS,
    "checkpoints/step-*/state.json": {"runner.elapsed", "runner.cpu_seconds"},
    "config.yaml": {"output.dir"},  # its header comment (a time stamp) is no YAML data
}
REPORT_CLOCKS = ("wall s",)  # columns of the `esbox report` table
CKPT = "checkpoints"


def varied_reward(self, completion, example):
    """Rewards that tell a random tiny model's completions apart, so the weights move."""
    return sum(map(ord, completion)) % 11


# The cut run: this process, with the same reward, SIGKILLs itself after the N-th call of a
# function: the metrics logger (a step has just been logged), safetensors' save_file (a
# checkpoint's tensors are written, its state.json is not), or the trajectory log's write (then
# with a line torn in half at the end of the file, as a kill in the middle of it leaves); or it
# gets Ctrl-C (SIGINT) in a held-out validation, before the step's metrics are logged.
CHILD = f"""
import os, signal, sys
{inspect.getsource(varied_reward)}
import esbox.checkpoint
from esbox.adapters.agents.evaluator import TrajectoryLog
from esbox.adapters.tasks.base import Task
from esbox.adapters.tasks.rollouts import HeldoutValidation
from esbox.cli.main import cli
from esbox.tracking import MetricsLogger

Task.reward = varied_reward
point, count = sys.argv[1], int(sys.argv[2])
owner, name = {{
    "step": (MetricsLogger, "__call__"),
    "checkpoint": (esbox.checkpoint, "save_file"),
    "trajectories": (TrajectoryLog, "write"),
    "interrupt": (HeldoutValidation, "measure"),
}}[point]
original, calls = getattr(owner, name), []

def killing(*args, **kwargs):
    result = original(*args, **kwargs)
    calls.append(None)
    if len(calls) == count:
        if point == "trajectories":
            with open(args[0].path, "a") as handle:
                handle.write('{{"step": 9, "mem')
        os.kill(os.getpid(), signal.SIGINT if point == "interrupt" else signal.SIGKILL)
    return result

setattr(owner, name, killing)
cli.main(sys.argv[3:])
"""


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=4096)


@pytest.fixture(autouse=True)
def same_reward_and_threads(monkeypatch: pytest.MonkeyPatch):
    """The child's reward here too; the LLM configs' ``threads: 1`` undone afterwards."""
    monkeypatch.setattr(Task, "reward", varied_reward)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def vector_config(model: Path) -> dict[str, Any]:
    return {
        "strategy": "copes",
        "seed": 2,
        "options": {"population": 8, "subspaces": 2},
        "problem": {"kind": "function", "name": "rastrigin", "dimension": 12},
        "budget": {"max_steps": 12},
        "checkpoint": {"every": 3},
    }


def vector_restart_config(model: Path) -> dict[str, Any]:
    """BIPOP restarts at steps 3, 6, 9 and 12 (criteria made quick); checkpoints at 4 and 8."""
    restarts = {"kind": "bipop", "tolfun_steps": 2, "tolfun": 0.3}
    return {**vector_config(model), "restarts": restarts, "checkpoint": {"every": 4}}


def llm_config(model: Path, **problem: Any) -> dict[str, Any]:
    return {
        "strategy": "copes",
        "seed": 3,
        "options": {"population": 4, "subspaces": 2, "sigma": 0.05, "learning_rate": 0.01},
        "problem": {
            "kind": "llm",
            "model": str(model),
            "batch_size": 2,
            "threads": 1,
            "task": {"kind": "arithmetic", "train_size": 20, "heldout_size": 3},
            "validation_every": 2,
            **problem,
        },
        "budget": {"max_steps": 5, "max_evaluations": None},
        "checkpoint": {"every": 2},
    }


def agent_config(model: Path) -> dict[str, Any]:
    prefill = '<tool_call>{"name": "calculator", "arguments": {"expression": "'
    agent = {"tools": ["calculator"], "max_turns": 2, "max_tokens": 48, "max_new_tokens": 24,
             "prefill": [prefill]}  # fmt: skip
    task = {"kind": "tool_math", "train_size": 20, "heldout_size": 2}
    return {**llm_config(model, task=task, agent=agent), "budget": {"max_steps": 4}}


def esopt_config(model: Path) -> dict[str, Any]:
    config = llm_config(
        model, validation_every=0, context_proposer="model", proposer_max_new_tokens=8
    )
    config["strategy"] = "esopt"
    config["options"] = {"population": 4, "sigma": 0.05, "learning_rate": 0.01,
                         "contexts": ["Add.", "Think."]}  # fmt: skip
    return config


def extended(config: dict[str, Any], steps: int) -> dict[str, Any]:
    return {**config, "budget": {**config["budget"], "max_steps": steps}}


CASES = {  # config, how the run is cut (a kill point, or "finish" then extend), summary keys
    "vector": (vector_config, ("step", 5), {"best_value"}),
    "vector-killed-in-checkpoint": (vector_config, ("checkpoint", 2), {"best_value"}),
    "vector-restarts": (vector_restart_config, ("step", 6), {"best_value", "restarts"}),
    "llm-validation": (llm_config, ("step", 3), {"baseline"}),
    "llm-ctrl-c-in-validation": (llm_config, ("interrupt", 2), {"baseline"}),
    "agent-tools": (agent_config, ("trajectories", 4), {"baseline"}),
    "esopt-contexts": (esopt_config, ("step", 3), {"contexts", "best_context"}),
    "llm-extended": (llm_config, ("finish", 3), {"baseline"}),
}


def optimize(config: dict[str, Any], out: Path) -> None:
    path = out.parent / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(cli, ["optimize", "-q", "-c", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output


def cut_short(config: dict[str, Any], out: Path, point: str, count: int) -> None:
    path = out.parent / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["optimize", "-q", "-c", str(path), "--out", str(out)]
    child = subprocess.run(
        [sys.executable, "-c", CHILD, point, str(count), *args], capture_output=True, text=True
    )
    if point == "interrupt":
        assert child.returncode == 130, child.stderr
        assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
        latest = json.loads((latest_checkpoint(out / CKPT) / "state.json").read_text())
        assert latest["runner"]["callbacks_pending"]  # the step's validation was cut short
    else:
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert not (out / "summary.json").exists()
    left = {  # what the cut left behind for the resume to put right
        "step": lambda: len((out / "metrics.jsonl").read_text().splitlines()) == count,
        "checkpoint": lambda: any(p.name.startswith(".step-") for p in (out / CKPT).iterdir()),
        "trajectories": lambda: (out / "trajectories.jsonl").read_text().endswith('"mem'),
        "interrupt": lambda: (out / "summary.json").is_file(),
    }
    assert left[point]()


def resume(out: Path, *sets: str) -> None:
    args = ["resume", "-q", str(out), *(x for s in sets for x in ("--set", s))]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("case", list(CASES))
def test_a_resumed_run_writes_the_files_of_a_run_that_never_stopped(tiny_lm, tmp_path, case):
    build, (point, count), expected = CASES[case]
    config = build(tiny_lm)
    straight, cut = tmp_path / "straight" / "run", tmp_path / "cut" / "run"
    straight.parent.mkdir(), cut.parent.mkdir()
    optimize(config, straight)
    if point == "finish":
        optimize(extended(config, count), cut)
        resume(cut, f"budget.max_steps={config['budget']['max_steps']}")
    else:
        cut_short(config, cut, point, count)
        resume(cut)
    summary = json.loads((straight / "summary.json").read_text())
    assert expected <= set(summary) and summary["steps"] == config["budget"]["max_steps"]
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert any(row["update_norm"] > 0 for row in rows)  # the parameters moved
    if "restarts" in expected:  # the cut run resumed in restart 1 and went through two more
        assert [r["end_step"] for r in summary["restarts"]] == [3, 6, 9, 12]
        assert [row["restart"] for row in rows][3:7] == [1, 1, 1, 2]
    assert_same_files(straight, cut, IGNORED)
    assert report_table(straight, tmp_path / "a", REPORT_CLOCKS) == report_table(
        cut, tmp_path / "b", REPORT_CLOCKS
    )


def test_the_comparison_sees_a_dropped_field_and_a_missing_file(tmp_path) -> None:
    straight, cut = tmp_path / "straight" / "run", tmp_path / "cut" / "run"
    straight.parent.mkdir(), cut.parent.mkdir()
    optimize(vector_config(tmp_path), straight)
    optimize(vector_config(tmp_path), cut)
    assert_same_files(straight, cut, IGNORED)
    summary = json.loads((cut / "summary.json").read_text())
    (cut / "summary.json").write_text(json.dumps({**summary, "best_value": 0.5}))
    with pytest.raises(AssertionError, match=r"summary\.json"):
        assert_same_files(straight, cut, IGNORED)
    (cut / "new.bin").write_bytes(b"")
    with pytest.raises(AssertionError, match=r"new\.bin"):
        assert_same_files(straight, cut, IGNORED)


class NaNFromStep2:
    """Rewards of a sphere, all NaN from step 2 on (a broken objective)."""

    def evaluate(self, space, perturbations):
        if perturbations[0].step >= 2:
            return np.full(len(perturbations), np.nan)
        with space.sweep(perturbations) as members:
            return np.array([-float(np.sum(space.vector**2)) for _ in members])


def test_a_resumed_run_stops_on_bad_rewards_where_a_straight_one_does(tmp_path) -> None:
    def runner(steps: int, directory: Path) -> Runner:
        space = VectorSpace(np.ones(6))
        strategy = esbox.make_strategy("openai_es", space, population=4, sigma=0.1)
        budget = Budget(max_steps=steps)
        options = {"checkpoint_dir": directory, "checkpoint_every": 1, "max_nonfinite_steps": 3}
        return Runner(space, strategy, NaNFromStep2(), budget, **options)

    with pytest.raises(RewardError, match="3 step"):
        runner(10, tmp_path / "straight").run()
    runner(4, tmp_path / "cut").run()  # steps 2 and 3 without a finite reward
    resumed = runner(10, tmp_path / "cut")
    resumed.resume(tmp_path / "cut")
    with pytest.raises(RewardError, match="3 step"):
        resumed.run()
    assert resumed.strategy.step == 4  # the third such step in a row, as without the stop


def test_a_checkpoint_from_before_the_callback_state_still_resumes(tmp_path) -> None:
    def runner(steps: int, directory: Path) -> Runner:
        space = VectorSpace(np.ones(6))
        strategy = esbox.make_strategy("openai_es", space, population=4, sigma=0.1)
        evaluator = FunctionEvaluator(lambda x: float(np.sum(x**2)))
        options = {"checkpoint_dir": directory, "checkpoint_every": 2}
        return Runner(space, strategy, evaluator, Budget(max_steps=steps), **options)

    straight = runner(6, tmp_path / "straight")
    straight.run()
    runner(4, tmp_path / "old").run()
    path = latest_checkpoint(tmp_path / "old") / "state.json"
    state = json.loads(path.read_text())
    del state["callbacks"], state["runner"]["callbacks_pending"]
    del state["runner"]["nonfinite_streak"]
    path.write_text(json.dumps(state))  # as esbox wrote it before issue 33
    resumed = runner(6, tmp_path / "old")
    resumed.resume(tmp_path / "old")
    resumed.run()
    assert np.array_equal(resumed.space.vector, straight.space.vector)
