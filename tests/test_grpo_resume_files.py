"""A GRPO run stopped (Ctrl-C, or kill -9 while a checkpoint is being written) and resumed with
``esbox resume`` writes the files of a run that never stopped: every file of the two run
directories is compared (tests/run_files.py), TRL's checkpoints included; only the clock and
path fields of ``IGNORED`` may differ (docs/grpo.md, "Stopping and resuming")."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import huggingface_hub
import torch
import yaml
from click.testing import CliRunner
from run_files import assert_same_files, report_table  # tests/run_files.py

from esbox.adapters.models.testing import save_tiny_lm
from esbox.adapters.rl.reward import TaskReward
from esbox.adapters.rl.rundir import STATE_FILE, prune_checkpoints
from esbox.adapters.tasks.arithmetic import ArithmeticTask
from esbox.cli.main import cli

MEASURED = {"wall_seconds", "cpu_seconds", "peak_rss_mib"}  # clocks, not computed
IGNORED = {  # the fields that may differ, per file (dotted keys go into lists)
    "summary.json": MEASURED | {"resumed", "run_dir", "model"},
    "metrics.jsonl": MEASURED,
    "checkpoints/checkpoint-*/esbox_state.json": MEASURED | {f"history.{k}" for k in MEASURED},
    "checkpoints/checkpoint-*/trainer_state.json": {"log_history.step_time"},  # TRL's clock
    "checkpoints/checkpoint-*/training_args.bin": {"output_dir"},  # the run directory
    "config.yaml": {"output.dir"},
}
REPORT_CLOCKS = ("wall s",)


def training_args(path: Path) -> dict:
    """TRL's pickled ``GRPOConfig`` as its dict (the pickle's bytes hold the output path)."""
    return json.loads(json.dumps(torch.load(path, weights_only=False).to_dict(), default=str))


READERS = {"checkpoints/checkpoint-*/training_args.bin": training_args}


def digit_reward(self, completion, example):
    """A reward with spread on a random model, so that GRPO's updates are not zero."""
    return sum(ch.isdigit() for ch in completion) / max(len(completion), 1)


# The kill -9: this process, with the same reward, SIGKILLs itself as TRL starts writing the
# optimizer state of its N-th checkpoint (the weights are written; TRL's state and esbox's are
# not: the checkpoint is incomplete and resume must skip it).
CHILD = f"""
import os, signal, sys
{inspect.getsource(digit_reward)}
from transformers import Trainer
from esbox.adapters.tasks.arithmetic import ArithmeticTask
from esbox.cli.main import cli

ArithmeticTask.reward = digit_reward
count, original, calls = int(sys.argv[1]), Trainer._save_optimizer_and_scheduler, []

def killing(*args, **kwargs):
    calls.append(None)
    if len(calls) == count:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kwargs)

Trainer._save_optimizer_and_scheduler = killing
cli.main(sys.argv[2:])
"""
STEPS, EVERY = 5, 2


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> dict:
    model = save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny")
    return {
        "seed": 1,
        "problem": {
            "kind": "llm",
            "model": str(model),
            "task": {"kind": "arithmetic", "train_size": 16, "heldout_size": 3},
            "batch_size": 2,
            "validation_every": 2,
            "threads": 1,
        },
        "grpo": {"num_generations": 2, "learning_rate": 0.05, "gradient_checkpointing": False},
        "budget": {"max_steps": STEPS, "max_evaluations": None},
        "checkpoint": {"every": EVERY},
    }


@pytest.fixture(scope="module", autouse=True)
def same_reward_and_threads():
    """The child's reward here too (for the module: the straight run is the module's); the
    config's ``threads: 1`` undone afterwards."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ArithmeticTask, "reward", digit_reward)
        yield
    torch.set_num_threads(threads)


def grpo_args(config: dict, out: Path) -> list[str]:
    path = out.parent / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return ["grpo", "-q", "-c", str(path), "--out", str(out)]


@pytest.fixture(scope="module")
def straight(config, tmp_path_factory) -> Path:
    """The run that never stopped."""
    out = tmp_path_factory.mktemp("straight") / "run"
    result = CliRunner().invoke(cli, grpo_args(config, out))
    assert result.exit_code == 0, result.output
    return out


def ctrl_c(config: dict, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT during the reward of the third optimizer step: the run stops after that step,
    with a checkpoint of it, and exits 130."""
    calls, score = [], TaskReward.__call__

    def interrupting(self, *args, **kwargs):
        calls.append(None)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return score(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(TaskReward, "__call__", interrupting)
        result = CliRunner().invoke(cli, grpo_args(config, out))
    assert result.exit_code == 130, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 3


def kill_in_checkpoint(config: dict, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 while the second checkpoint (step 4) is being written: steps 2 and 3 were
    logged after the last complete checkpoint and are lost with the process."""
    args = [sys.executable, "-c", CHILD, "2", *grpo_args(config, out)]
    # the hub's offline mode as this process has it (read at import): the saved tokenizer
    # config records it (local_files_only); the model is a local folder either way
    offline = "1" if huggingface_hub.is_offline_mode() else "0"
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_OFFLINE"}
    child = subprocess.run(
        args, capture_output=True, text=True, env={**env, "HF_HUB_OFFLINE": offline}
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert not (out / "summary.json").exists()
    torn = out / "checkpoints" / f"checkpoint-{2 * EVERY}"
    assert (torn / "model.safetensors").is_file() and not (torn / "esbox_state.json").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2 * EVERY


CUTS = {"ctrl-c": ctrl_c, "kill-9-in-checkpoint": kill_in_checkpoint}


@pytest.mark.parametrize("cut", list(CUTS))
def test_a_resumed_grpo_run_writes_the_files_of_a_run_that_never_stopped(
    config, straight, tmp_path, monkeypatch, cut
):
    out = tmp_path / "cut" / "run"
    CUTS[cut](config, out, monkeypatch)
    resumed = CliRunner().invoke(cli, ["resume", "-q", str(out)])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] and summary["steps"] == STEPS and "baseline" in summary
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(STEPS))
    assert sum(row["grad_norm"] > 0 for row in rows) >= 3  # the weights moved
    assert_same_files(straight, out, IGNORED, READERS)
    tables = [report_table(run, tmp_path / name, REPORT_CLOCKS) for name, run in
              (("a", straight), ("b", out))]  # fmt: skip
    assert tables[0] == tables[1]


@pytest.mark.parametrize(
    ("every", "keep", "left"),
    [(2, 2, [4, 6]), (2, None, [2, 4, 6]), (0, None, [2, 3, 4, 6]), (0, 1, [6])],
)
def test_checkpoints_off_schedule_or_cut_short_go_once_a_newer_one_is_complete(
    tmp_path, every, keep, left
):
    for step in (2, 3, 4, 5, 6):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"")
        if step != 5:  # checkpoint-5 was cut short by a kill: no esbox state
            (folder / STATE_FILE).write_text("{}")
    prune_checkpoints(tmp_path / "checkpoint-6", every, keep)
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.iterdir()) == left
