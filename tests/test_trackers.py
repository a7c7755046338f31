"""Trackers: TensorBoard event files and offline wandb runs carry exactly the JSONL's numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from esbox.cli.main import cli
from esbox.trackers import TrackingConfig, scalars

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def optimize(out: Path, *sets: str, steps: int = 6) -> CliRunner:
    args = ["optimize", "-q", "--strategy", "openai_es", "--out", str(out)]
    for key in ("problem.dimension=10", f"budget.max_steps={steps}", "checkpoint.every=2", *sets):
        args += ["--set", key]
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def jsonl(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def board(run: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def expected(rows: list[dict], skip: tuple[str, ...] = ()) -> dict[str, list[tuple[int, float]]]:
    """The JSONL's numbers as TensorBoard stores them (float32), by tag."""
    tags: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in scalars(row).items():
            if key not in skip:
                tags.setdefault(key, []).append((row["step"], float(np.float32(value))))
    return tags


def test_tensorboard_scalars_equal_the_jsonl(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert optimize(run, "tracking.tensorboard=true").exit_code == 0
    rows = jsonl(run)
    logged = board(run)
    assert {"reward_mean", "best_value", "sigma", "learning_rate", "update_norm"} <= set(logged)
    assert logged == expected(rows)
    assert [step for step, _ in logged["reward_mean"]] == list(range(6))


def test_a_resumed_run_logs_each_step_once(tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert optimize(straight, "tracking.tensorboard=true").exit_code == 0
    assert optimize(split, "tracking.tensorboard=true", steps=3).exit_code == 0  # saved at 2
    resumed = CliRunner().invoke(cli, ["resume", "-q", str(split), "--set", "budget.max_steps=6"])
    assert resumed.exit_code == 0, resumed.output
    # step 2 ran twice (before the stop and after the resume): TensorBoard keeps the second
    logged = board(split)
    assert [step for step, _ in logged["reward_mean"]] == list(range(6))
    assert logged == expected(jsonl(split))
    timeless = expected(jsonl(split), skip=("wall_seconds",))
    assert timeless == expected(jsonl(straight), skip=("wall_seconds",))


def test_wandb_offline_run_gets_the_jsonl_numbers(tmp_path: Path, monkeypatch) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # belt and braces: never online in tests
    logged: list[tuple[dict, int]] = []
    real_log = wandb.sdk.wandb_run.Run.log

    def log(self, data, step=None, **kwargs):
        logged.append((dict(data), step))
        return real_log(self, data, step=step, **kwargs)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", log)
    run = tmp_path / "run"
    result = optimize(run, "tracking.wandb={project: esbox-test, tags: [ci]}", steps=3)
    assert result.exit_code == 0, result.output
    assert logged == [(scalars(row), row["step"]) for row in jsonl(run)]
    run_id = (run / "wandb" / "esbox-run-id").read_text().strip()
    (offline,) = (run / "wandb").glob(f"offline-run-*-{run_id}")
    assert (offline / f"run-{run_id}.wandb").stat().st_size > 0
    resumed = CliRunner().invoke(cli, ["resume", "-q", str(run), "--set", "budget.max_steps=5"])
    assert resumed.exit_code == 0, resumed.output
    # each sync folder holds run-<id>.wandb (wandb adds "-1" to a folder name taken that second)
    logs = (run / "wandb").glob("offline-run-*/run-*.wandb")
    runs = {path.stem.removeprefix("run-") for path in logs}
    assert runs == {run_id}  # the resume logs to the same wandb run
    assert [step for _, step in logged] == [0, 1, 2, 3, 4]  # on from the final checkpoint


@pytest.mark.parametrize(
    ("package", "setting"),
    [("wandb", "tracking.wandb={project: p}"), ("tensorboard", "tracking.tensorboard=true")],
)
def test_a_missing_package_is_named_before_the_run_starts(
    tmp_path: Path, monkeypatch, package: str, setting: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed
    result = optimize(tmp_path / "run", setting)
    assert result.exit_code == 2
    assert f"tracking.{package} needs the {package} package: pip install {package}" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("tracking.wandb=true", "tracking key 'wandb' must be of type mapping"),
        ("tracking.wandb={projet: x}", "unknown tracking.wandb key 'projet'; did you mean"),
        ("tracking.wandb={mode: shared}", "tracking.wandb key 'mode' is 'shared'"),
        ("tracking.tensorbord=true", "unknown tracking key 'tensorbord'"),
    ],
)
def test_bad_tracking_keys_are_named(tmp_path: Path, setting: str, message: str) -> None:
    result = optimize(tmp_path / "run", setting)
    assert result.exit_code == 2 and message in result.output, result.output


def test_scalars_are_the_numbers_of_the_record() -> None:
    metrics = {"step": 3, "reward_mean": float("nan"), "flag": True, "note": "x", "val": 0.5}
    assert scalars(metrics) == {"step": 3.0, "val": 0.5}
    assert TrackingConfig(wandb={"project": "p"}).wandb["mode"] == "offline"
    assert TrackingConfig().wandb == {}
