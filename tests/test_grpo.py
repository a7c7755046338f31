"""GRPO from an esbox config (TRL's GRPOTrainer, peft for LoRA) on a tiny model, offline."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import yaml
from click.testing import CliRunner
from safetensors.torch import load_file

from esbox.adapters.models.testing import save_tiny_lm
from esbox.adapters.rl.reward import TaskReward
from esbox.adapters.tasks.arithmetic import ArithmeticTask
from esbox.cli.main import cli

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-llama")


def digit_reward_on(monkeypatch) -> None:
    """A reward with spread on a random model (the share of digits in the completion), so that
    GRPO's advantages, and so its updates, are not zero."""
    monkeypatch.setattr(
        ArithmeticTask, "reward", lambda self, c, e: sum(ch.isdigit() for ch in c) / max(len(c), 1)
    )


@pytest.fixture
def digit_reward(monkeypatch):
    digit_reward_on(monkeypatch)


def write_config(path: Path, model: Path, **sections) -> Path:
    config = {
        "seed": 0,
        "problem": {
            "kind": "llm",
            "model": str(model),
            "task": {"kind": "arithmetic", "train_size": 16, "heldout_size": 4},
            "batch_size": 2,
            "validation_every": 2,
        },
        "grpo": {"num_generations": 2, "learning_rate": 0.01, "gradient_checkpointing": False},
        "budget": {"max_steps": 2, "max_evaluations": None},
        "checkpoint": {"every": 1},
        "output": {"dir": str(path.parent / "run")},
        **sections,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("grpo.num_generatons=2", "grpo.num_generatons is not a field of trl.GRPOConfig; did you "
         "mean 'num_generations'"),
        ("grpo.output_dir=x", "grpo.output_dir is set by esbox (the run directory"),
        ("grpo.max_steps=3", "grpo.max_steps is set by esbox (budget.max_steps)"),
        ("lora.rank=8", "lora.rank is not a field of peft.LoraConfig"),
        ("lora.task_type=SEQ_CLS", "lora.task_type is set by esbox"),
        ("budget.max_evaluations=100", "budget.max_evaluations counts ES members"),
        ("grpo.gradient_accumulation_steps=3", "must divide problem.batch_size x num_generations"),
        ("problem.task={kind: arithmetic, digts: 2}", "digts"),
    ],
)  # fmt: skip
def test_bad_grpo_and_lora_keys_exit_2_naming_the_key(tiny_lm, tmp_path, setting, named):
    config = write_config(tmp_path / "c.yaml", tiny_lm)
    result = invoke("grpo", "-c", str(config), "--set", setting)
    assert result.exit_code == 2 and named in result.output, result.output
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


def test_dry_run_prints_the_resolved_grpo_config(tiny_lm, tmp_path):
    config = write_config(tmp_path / "c.yaml", tiny_lm, lora={"r": 4})
    result = invoke("grpo", "-c", str(config), "--dry-run")
    printed = yaml.safe_load(result.output)
    assert printed["strategy"] == "lora-grpo" and printed["lora"] == {"r": 4}
    assert printed["grpo"]["num_generations"] == 2 and "options" not in printed


def test_grpo_run_writes_an_es_run_directory(tiny_lm, tmp_path, digit_reward):
    config = write_config(tmp_path / "c.yaml", tiny_lm)
    result = invoke("grpo", "-q", "-c", str(config))
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["stop_reason"] == "max_steps"
    assert summary["strategy"] == "grpo" and summary["steps"] == 2
    assert summary["samples"] == 2 * 2 * 2  # steps x prompts x generations
    assert summary["baseline"]["val_step"] == 0 and "val_accuracy" in summary["baseline"]
    logged = rows(run)
    assert [r["step"] for r in logged] == [0, 1] and logged[1]["val_step"] == 2
    for key in ("reward_mean", "reward_std", "wall_seconds", "cpu_seconds", "samples",
                "peak_rss_mib"):  # fmt: skip
        assert logged[-1][key] is not None, key
    assert logged[0]["cpu_seconds"] > 0 and logged[1]["samples"] == 8
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["grpo"]["learning_rate"] == 0.01 and saved["strategy"] == "grpo"
    before = load_file(str(tiny_lm / "model.safetensors"))
    after = load_file(str(run / "model" / "model.safetensors"))
    assert any(not (before[k] == after[k]).all() for k in before)  # it trained
    scored = invoke("evaluate", "--model", str(run / "model"), "--task",
                    "{kind: arithmetic, train_size: 4, heldout_size: 3}")  # fmt: skip
    assert scored.exit_code == 0 and "| accuracy |" in scored.output
    es = tmp_path / "es"
    es_sets = ["--set", "options.population=2", "--set", "budget.max_steps=2"]
    es_run = invoke("optimize", "-q", "-c", str(config), "-s", "openai_es", "-o", str(es), *es_sets)
    assert es_run.exit_code == 0, es_run.output
    assert rows(es)[-1]["samples"] == 2 * 2 * 2 and rows(es)[-1]["cpu_seconds"] > 0
    report = invoke("report", str(es), str(run), "-o", str(tmp_path / "r"), "--x-axis", "samples")
    assert report.exit_code == 0, report.output
    assert (tmp_path / "r" / "validation.png").is_file()
    assert "| grpo |" in report.output and "| openai_es |" in report.output


def test_lora_grpo_trains_an_adapter_and_saves_the_merged_model(tiny_lm, tmp_path, digit_reward):
    config = write_config(tmp_path / "c.yaml", tiny_lm, lora={"r": 2, "lora_alpha": 4})
    result = invoke("grpo", "-q", "-c", str(config), "--set", "grpo.learning_rate=0.1")
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategy"] == "lora-grpo" and (run / "adapter").is_dir()
    before = load_file(str(tiny_lm / "model.safetensors"))
    after = load_file(str(run / "model" / "model.safetensors"))
    assert after.keys() == before.keys()  # merged: a plain transformers model
    assert summary["trainable_parameters"] < sum(t.numel() for t in before.values()) / 5
    changed = [k for k in before if not (before[k] == after[k]).all()]
    assert changed and all("proj" in k for k in changed)  # only the adapted projections


def interrupt_at_reward_call(monkeypatch, call: int) -> None:
    """SIGINT to this process during the ``call``-th reward call: as if Ctrl-C were pressed."""
    calls = []
    score = TaskReward.__call__

    def interrupting(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGINT)
        return score(self, *args, **kwargs)

    monkeypatch.setattr(TaskReward, "__call__", interrupting)


def test_ctrl_c_stops_after_the_step_and_resumes_bit_identical(
    tiny_lm, tmp_path, digit_reward, monkeypatch
):
    budget = {"max_steps": 3, "max_evaluations": None}
    straight = write_config(tmp_path / "a" / "c.yaml", tiny_lm, budget=budget)
    assert invoke("grpo", "-q", "-c", str(straight)).exit_code == 0
    split = write_config(tmp_path / "b" / "c.yaml", tiny_lm, budget=budget,
                         checkpoint={"every": 0})  # fmt: skip
    interrupt_at_reward_call(monkeypatch, 2)
    result = CliRunner().invoke(cli, ["grpo", "-q", "-c", str(split)])
    assert result.exit_code == 130, result.output
    run = tmp_path / "b" / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 2
    assert sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2"]
    monkeypatch.undo()
    digit_reward_on(monkeypatch)
    resumed = invoke("resume", "-q", str(run))
    assert resumed.exit_code == 0, resumed.output
    a = load_file(str(tmp_path / "a" / "run" / "model" / "model.safetensors"))
    b = load_file(str(run / "model" / "model.safetensors"))
    assert all((a[k] == b[k]).all() for k in a)
    same = ("step", "reward_mean", "reward_std", "samples", "loss", "grad_norm", "val_accuracy")
    ra, rb = rows(tmp_path / "a" / "run"), rows(run)
    assert [[r.get(k) for k in same] for r in ra] == [[r.get(k) for k in same] for r in rb]
    assert [r["step"] for r in rb] == [0, 1, 2] and rb[1]["grad_norm"] > 0
    assert json.loads((run / "summary.json").read_text())["resumed"]


def test_kill_9_resumes_from_the_last_complete_checkpoint(tiny_lm, tmp_path):
    import subprocess
    import sys
    import time

    config = write_config(tmp_path / "c.yaml", tiny_lm, budget={"max_steps": 500})
    run = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-m", "esbox.cli.main", "grpo", "-q", "-c", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / "checkpoint-2" / "esbox_state.json").is_file():
            assert child.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.05)
    finally:
        child.kill()  # SIGKILL: no handler runs, no summary is written
        child.wait()
    assert not (run / "summary.json").exists()
    kept = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("checkpoint-*")
               if (p / "esbox_state.json").is_file())  # fmt: skip
    resumed = invoke("resume", "-q", str(run), "--set", f"budget.max_steps={kept + 1}")
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in rows(run)] == list(range(kept + 1))  # no repeated or lost step
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed"] and summary["steps"] == kept + 1
    assert summary["samples"] == (kept + 1) * 4


@pytest.mark.parametrize("clock", ["max_seconds", "max_cpu_seconds"])
def test_a_time_budget_stops_after_a_step_and_resume_needs_a_checkpoint(
    tiny_lm, tmp_path, clock
):
    budget = {"max_steps": 50, clock: 0.001, "max_evaluations": None}
    config = write_config(tmp_path / "c.yaml", tiny_lm, budget=budget, checkpoint={"every": 0})
    assert invoke("grpo", "-q", "-c", str(config), "--out", str(tmp_path / "r")).exit_code == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["stop_reason"] == clock and summary["steps"] == 1
    assert (tmp_path / "r" / "checkpoints" / "checkpoint-1" / "esbox_state.json").is_file()
    (tmp_path / "r" / "checkpoints" / "checkpoint-1" / "esbox_state.json").unlink()  # cut short
    result = invoke("resume", str(tmp_path / "r"))
    assert result.exit_code == 2 and "holds no complete checkpoint" in result.output
