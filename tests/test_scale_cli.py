"""The ``scale:`` section: ``esbox optimize``/``resume`` run the same config in one process or on
Ray workers and end bit-identical; Ctrl-C stops a pooled run cleanly, Ray included.

The in-process runs share one Ray session (2 CPUs), which the command then uses as it finds it;
one run in a subprocess starts (and, interrupted, stops) its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from click.testing import CliRunner  # noqa: E402

from esbox.adapters.problems.runs import (  # noqa: E402
    build_session,
    check_strategy,
    load_config,
    resolve_config,
)
from esbox.adapters.problems.runs import dry_run as check_run  # noqa: E402
from esbox.adapters.scale import PoolError  # noqa: E402
from esbox.cli.main import cli  # noqa: E402
from esbox.errors import ConfigError  # noqa: E402
from esbox.resources import MEASURED_FIELDS  # noqa: E402
from esbox.runconfig import RunConfig, apply_overrides  # noqa: E402
from esbox.specs import Term, Update  # noqa: E402

RASTRIGIN = {
    "strategy": "copes",
    "problem.dimension": 20,
    "budget.max_steps": 6,
    "budget.max_evaluations": "null",
    "checkpoint.every": 1,
}
POOL = {"scale.workers": 2, "scale.cpus": 0.5}
SLOW_OBJECTIVE = """\
import os
import signal
import time

import numpy as np


def slow(x):
    time.sleep(0.05)
    return float(np.sum((x - 0.5) ** 2))


def doomed(x):
    if os.path.exists(os.path.join(os.path.dirname(__file__), "doom")):
        os.kill(os.getpid(), signal.SIGKILL)  # every worker that scores a member dies
    return slow(x)
"""


def sets(**groups: dict) -> list[str]:
    return [f"--set={key}={value}" for group in groups.values() for key, value in group.items()]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def optimize(out: Path, *settings: dict) -> None:
    merged = {key: value for group in settings for key, value in group.items()}
    result = invoke("optimize", "-q", "--out", str(out), *sets(run=merged))
    assert result.exit_code == 0, result.output


def same_outputs(a: Path, b: Path, files: tuple[str, ...] = ("final.npy", "best.npy")) -> None:
    for name in files:
        assert np.load(a / name).tobytes() == np.load(b / name).tobytes(), name
    assert metrics(a) == metrics(b)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(-1).view(torch.uint8)


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in MEASURED_FIELDS} for row in rows]


# -- the section, checked without Ray ------------------------------------------------------------
def config(**overrides: object) -> RunConfig:
    values = {"problem.dimension": 5, **overrides}
    return resolve_config(apply_overrides({}, [f"{k}={v}" for k, v in values.items()]))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("scale.workers", -1, "scale key 'workers' must be >= 0"),
        ("scale.placement", "pack", r"scale key 'placement' is 'pack'.*allowed: default, spread"),
        ("scale.wokers", 2, r"unknown scale key 'wokers'.*workers"),
    ],
)
def test_bad_scale_keys_are_named(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**{key: value})


def test_what_a_pool_cannot_run_is_refused_before_anything_starts() -> None:
    bad_address = config(**{"scale.workers": 2, "scale.address": "my cluster"})
    with pytest.raises(ConfigError, match=r"scale.address is 'my cluster'; allowed: local, auto"):
        check_strategy(bad_address)
    esopt = {"strategy": "esopt", "options.contexts": "[a, b]", "options.population": 4}
    contexts = config(**esopt, **{"scale.workers": 2})
    with pytest.raises(ConfigError, match=r"scale\.workers: strategy esopt co-evolves options"):
        check_strategy(contexts)


def test_a_dry_run_starts_no_ray(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a dry run started Ray")

    monkeypatch.setattr(ray, "init", refuse)
    check_run(config(**POOL))


# -- runs ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    """The Rastrigin run in one process."""
    out = tmp_path_factory.mktemp("single") / "run"
    optimize(out, RASTRIGIN)
    return out


def test_optimize_on_workers_ends_bit_identical_to_one_process(ray_session, single, tmp_path):
    optimize(tmp_path / "pooled", RASTRIGIN, POOL)
    same_outputs(single, tmp_path / "pooled")
    resolved = (tmp_path / "pooled" / "config.yaml").read_text()
    assert "scale:\n  workers: 2\n" in resolved  # re-running the config runs on the pool


def test_without_a_driver_replica_the_workers_save_the_result(ray_session, single, tmp_path):
    optimize(tmp_path / "pooled", RASTRIGIN, POOL, {"scale.driver_replica": "false"})
    same_outputs(single, tmp_path / "pooled")


@pytest.mark.parametrize(("first", "then"), [(2, 1), (0, 2)])
def test_resume_onto_another_number_of_workers(ray_session, single, tmp_path, first, then):
    run = tmp_path / "run"
    optimize(run, RASTRIGIN, {**POOL, "scale.workers": first, "budget.max_steps": 3})
    more = ["--set=budget.max_steps=6", f"--set=scale.workers={then}"]
    result = invoke("resume", "-q", str(run), *more)
    assert result.exit_code == 0, result.output
    same_outputs(single, run)


def test_verify_every_names_the_replica_that_drifted(ray_session, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("problem: {dimension: 8}\nbudget: {max_steps: 3}\n")
    overrides = [f"{k}={v}" for k, v in {**POOL, "scale.verify_every": 1}.items()]
    session = build_session(load_config(path, overrides))
    try:
        term = Term(seed=3, coefficient=1.0)
        stray = Update(run_seed=0, step=0, terms=(term,), learning_rate=0.1)
        ray.get(session.pool.actors[1].apply.remote(stray.to_dict()))
        with pytest.raises(PoolError, match=r"actor 1 of 2 \(pid .*\) holds other parameters than"):
            session.runner().run()
        assert session.strategy.step == 1  # caught after the first step
    finally:
        session.close()
    assert session.pool.actors == []  # closed with the session


def slow_problem(directory: Path, function: str = "slow") -> dict:
    (directory / "slow.py").write_text(SLOW_OBJECTIVE)
    return {
        "strategy": "openai_es",
        "problem.kind": "callable",
        "problem.target": f"{directory / 'slow.py'}:{function}",
        "problem.x0": "[1.0, 2.0, 3.0]",
        "options.population": 4,
        "budget.max_steps": 12,
        "budget.max_evaluations": "null",
        "checkpoint.every": 1,
    }


def wait_for(path: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_workers_lost_beyond_the_retries_stop_the_run_and_resume_continues(
    ray_session, tmp_path
) -> None:
    problem = slow_problem(tmp_path, "doomed")
    run = tmp_path / "pooled"

    def doom_after_step_3() -> None:
        wait_for(run / "checkpoints" / "step-00000003")
        (tmp_path / "doom").touch()

    planter = threading.Thread(target=doom_after_step_3, daemon=True)
    planter.start()
    args = sets(run=problem, scale={**POOL, "scale.retries": 1})
    result = invoke("optimize", "-q", "--out", str(run), *args)
    planter.join()
    assert result.exit_code == 3, result.output
    died = r"actor [01] of 2 \(pid .*\) died while evaluating member"
    assert re.search(rf"{died}.*retries=1.*esbox resume {run}", result.output, re.S)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["stop_reason"] == "pool_failed"
    (tmp_path / "doom").unlink()
    result = invoke("resume", "-q", str(run))
    assert result.exit_code == 0, result.output
    optimize(tmp_path / "single", problem)
    same_outputs(tmp_path / "single", run)


def test_an_interrupted_pooled_run_stops_its_ray_and_resumes_bit_identically(
    ray_session, tmp_path
) -> None:
    problem = slow_problem(tmp_path)
    run = tmp_path / "pooled"
    command = [sys.executable, "-m", "esbox.cli.main", "optimize", "-q", "--out", str(run)]
    command += sets(run=problem, scale={"scale.workers": 1})  # its own Ray: scale.address local
    child = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(run / "checkpoints" / "step-00000002")
        ray_processes = psutil.Process(child.pid).children(recursive=True)
        assert any("raylet" in p.name() for p in ray_processes)
        os.killpg(child.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole process group
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 130, err
    assert "Continue with: esbox resume" in err
    time.sleep(1)
    alive = [p for p in ray_processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []  # Ray went with it
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] < 12
    result = invoke("resume", "-q", str(run), "--set=scale.workers=2", "--set=scale.cpus=0.5")
    assert result.exit_code == 0, result.output
    optimize(tmp_path / "single", problem)
    same_outputs(tmp_path / "single", run)


def test_an_llm_run_on_workers_trains_the_same_weights(ray_session, tmp_path) -> None:
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from esbox.adapters.models.testing import save_tiny_lm

    model = save_tiny_lm(tmp_path / "tiny-llama")
    llm = {
        "problem.kind": "llm",
        "problem.model": str(model),
        "problem.batch_size": 2,
        "problem.task": "{kind: arithmetic, train_size: 20, heldout_size: 4}",
        "problem.validation_every": 2,  # on the driver's replica, which follows every update
        "options.population": 4,
        "options.subspaces": 2,
        "options.sigma": 0.01,
        "options.learning_rate": 0.001,
        "budget.max_steps": 3,
        "budget.max_evaluations": "null",
    }
    optimize(tmp_path / "single", llm)
    optimize(tmp_path / "pooled", llm, POOL)
    runs = ("single", "pooled")
    single, pooled = (load_file(str(tmp_path / r / "model" / "model.safetensors")) for r in runs)
    assert single.keys() == pooled.keys()
    assert all(bits(single[k]).equal(bits(pooled[k])) for k in single)
    assert metrics(tmp_path / "single") == metrics(tmp_path / "pooled")
    assert "val_accuracy" in metrics(tmp_path / "pooled")[1]
