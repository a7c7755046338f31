"""The ``esbox`` command: each command, each user error, resume after a kill, reports, docs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from esbox.adapters.problems import problem_options
from esbox.cli import reference
from esbox.cli.main import cli
from esbox.runconfig import config_reference
from esbox.tracking import FIELDS, MetricsLogger, read_metrics

ROOT = Path(__file__).resolve().parents[1]
ESBOX = [sys.executable, "-c", "from esbox.cli.main import main; main()"]
# A tiny, fast run: 8 members in 12 dimensions.
TINY = [
    "--set",
    "problem.dimension=12",
    "--set",
    "options.population=8",
    "--set",
    "budget.max_steps=15",
    "--set",
    "checkpoint.every=4",
]

SLOW_FUNCTION = """
import time
import numpy as np

def slow_sphere(x):
    time.sleep(0.003)
    return float(np.sum((x - 1.0) ** 2))
"""


def invoke(*args: str, cwd: Path | None = None):
    runner = CliRunner()
    if cwd is not None:
        old = os.getcwd()
        os.chdir(cwd)
    try:
        return runner.invoke(cli, list(args), catch_exceptions=False)
    finally:
        if cwd is not None:
            os.chdir(old)


def run_ok(*args: str, cwd: Path | None = None):
    result = invoke(*args, cwd=cwd)
    assert result.exit_code == 0, result.output
    return result


def same_run(a: Path, b: Path) -> None:
    """Bit-identical parameters and identical per-step metrics (wall time aside)."""
    for name in ("best.npy", "final.npy"):
        np.testing.assert_array_equal(np.load(a / name), np.load(b / name))
    rows_a, rows_b = read_metrics(a / "metrics.jsonl"), read_metrics(b / "metrics.jsonl")
    assert len(rows_a) == len(rows_b)
    for x, y in zip(rows_a, rows_b, strict=True):
        x.pop("wall_seconds"), y.pop("wall_seconds")
        assert x == y


# -- optimize -----------------------------------------------------------------------------------
def test_optimize_writes_a_run_directory(tmp_path):
    out = tmp_path / "run"
    result = run_ok("optimize", "-q", *TINY, "--out", str(out))
    assert re.search(r"copes on rastrigin\(d=12\): best [\d.]+ after 15 steps", result.output)
    assert {"config.yaml", "metrics.jsonl", "best.npy", "final.npy", "summary.json"} <= {
        p.name for p in out.iterdir()
    }
    assert (out / "checkpoints" / "latest").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["stop_reason"] == "max_steps"
    assert summary["steps"] == 15 and summary["evaluations"] == 120
    rows = read_metrics(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(15))
    assert all(list(row)[: len(FIELDS)] == list(FIELDS) for row in rows)
    assert rows[-1]["best_value"] == pytest.approx(summary["best_value"])
    assert np.load(out / "best.npy").shape == (12,)


def test_default_run_in_a_real_process(tmp_path):
    """`esbox optimize --strategy copes` with nothing else, then `esbox report` on it."""
    done = subprocess.run(
        [*ESBOX, "optimize", "--strategy", "copes"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "copes on rastrigin(d=100): best" in done.stdout
    assert "Traceback" not in done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("copes-")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best_value"] < 0.9 * read_metrics(run_dir / "metrics.jsonl")[0]["best_value"]
    done = subprocess.run(
        [*ESBOX, "report", str(run_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (run_dir / "report" / "best.png").stat().st_size > 10_000


def test_set_overrides_reach_the_saved_config(tmp_path):
    out = tmp_path / "run"
    run_ok(
        "optimize",
        "-q",
        *TINY,
        "--strategy",
        "openai_es",
        "--seed",
        "7",
        "--set",
        "options.sigma={kind: cosine, start: 0.2, end: 0.01, steps: 15}",
        "--set",
        "options.learning_rate=1e-2",
        "--set",
        "problem.name=sphere",
        "--out",
        str(out),
    )
    saved = (out / "config.yaml").read_text()
    assert "strategy: openai_es" in saved and "seed: 7" in saved and "name: sphere" in saved
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[0]["sigma"] == pytest.approx(0.2) and rows[-1]["sigma"] < 0.2
    assert rows[0]["learning_rate"] == pytest.approx(0.01)


def test_config_file_and_round_trip(tmp_path):
    """The saved resolved config re-runs the same run, bit for bit."""
    config = tmp_path / "run.yaml"
    config.write_text(
        "strategy: esopt\nseed: 3\noptions:\n  population: 6\n  sigma: 0.1\n"
        "problem:\n  name: ackley\n  dimension: 9\n  shift: 4\nbudget:\n  max_steps: 12\n"
    )
    run_ok("optimize", "-q", "-c", str(config), "--out", str(tmp_path / "a"))
    run_ok(
        "optimize", "-q", "-c", str(tmp_path / "a" / "config.yaml"), "--out", str(tmp_path / "b")
    )
    same_run(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "a" / "config.yaml").read_text().split("\n", 2)[2] == (
        tmp_path / "b" / "config.yaml"
    ).read_text().split("\n", 2)[2].replace("/b\n", "/a\n")


def test_dry_run_prints_the_resolved_config(tmp_path):
    result = run_ok("optimize", "--dry-run", "--set", "budget.max_steps=3", cwd=tmp_path)
    assert "max_steps: 3" in result.output and "subspaces: 4" in result.output
    assert not (tmp_path / "runs").exists()


def test_strategy_flag_drops_the_other_strategys_options(tmp_path):
    """--strategy on a config written for CoPES keeps the shared options and drops the rest,
    saying so; an option set explicitly with --set is still checked."""
    config = tmp_path / "copes.yaml"
    config.write_text(
        "strategy: copes\noptions: {population: 8, subspaces: 2, antithetic: false, "
        "sigma: 0.3}\nproblem: {name: sphere, dimension: 5}\nbudget: {max_steps: 2}\n"
    )
    for strategy, dropped in [("esopt", "subspaces, antithetic"), ("openai_es", "subspaces")]:
        result = run_ok("optimize", "-q", "-c", str(config), "-s", strategy, "--dry-run")
        assert f"drops the config's options it does not take: {dropped}" in result.output
        assert f"strategy: {strategy}" in result.output
        assert "population: 8" in result.output and "sigma: 0.3" in result.output
    result = run_ok("optimize", "-q", "-c", str(config), "-s", "copes", "--dry-run")
    assert "drops" not in result.output and "subspaces: 2" in result.output
    result = invoke(
        "optimize", "-c", str(config), "-s", "esopt", "--set", "options.subspaces=2", "--dry-run"
    )
    assert result.exit_code == 2 and "unknown esopt option 'subspaces'" in result.output


def test_callable_problems(tmp_path):
    (tmp_path / "objective.py").write_text(SLOW_FUNCTION.replace("time.sleep(0.003)", "pass"))
    out = tmp_path / "file"
    run_ok(
        "optimize",
        "-q",
        "--strategy",
        "openai_es",
        "--set",
        "problem={kind: callable, target: objective.py:slow_sphere, x0: 0.0, dimension: 5}",
        "--set",
        "budget.max_steps=30",
        "--set",
        "options.sigma=0.1",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    target = (out / "config.yaml").read_text().split("target: ")[1].split("\n")[0]
    assert Path(target.rsplit(":", 1)[0]).is_absolute()  # re-runnable from anywhere
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_value"] < 5.0
    run_ok(
        "optimize",
        "-q",
        "-c",
        str(ROOT / "examples" / "callable.yaml"),
        "--set",
        "budget.max_steps=3",
        "--out",
        str(tmp_path / "module"),
    )


def test_existing_directory_is_never_overwritten_silently(tmp_path):
    out = tmp_path / "run"
    run_ok("optimize", "-q", *TINY, "--out", str(out))
    before = (out / "metrics.jsonl").read_text()
    result = invoke("optimize", "-q", *TINY, "--out", str(out))
    assert result.exit_code == 2 and "already exists" in result.output
    assert (out / "metrics.jsonl").read_text() == before
    run_ok("optimize", "-q", *TINY, "--seed", "1", "--out", str(out), "--overwrite")
    assert (out / "metrics.jsonl").read_text() != before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    result = invoke("optimize", "-q", *TINY, "--out", str(other), "--overwrite")
    assert result.exit_code == 2 and "not an esbox run directory" in result.output
    assert (other / "keep.txt").read_text() == "mine"


def test_templated_directories_get_fresh_names(tmp_path):
    template = str(tmp_path / "runs" / "{strategy}-{seed}-{time}")
    run_ok("optimize", "-q", *TINY, "--set", f"output.dir={template}")
    run_ok("optimize", "-q", *TINY, "--set", f"output.dir={template}")
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(names) == 2 and all(n.startswith("copes-0-") for n in names)


# -- errors -------------------------------------------------------------------------------------
ERRORS = [
    (["--set", "budjet.max_steps=3"], ["budjet", "did you mean 'budget'"]),
    (["--set", "options.populaton=8"], ["populaton", "did you mean 'population'"]),
    (["--set", "problem.dimensoin=8"], ["dimensoin", "did you mean 'dimension'"]),
    (["--strategy", "cope"], ["strategy 'cope'", "did you mean 'copes'"]),
    (["--set", "options.population=eight"], ["'population'", "type int"]),
    (["--set", "options.sigma=fast"], ["sigma"]),
    (["--set", "options.population=0"], ["'population'", ">= 1"]),
    (["--set", "budget.max_steps=-5"], ["'max_steps'", ">= 1"]),
    (["--set", "options.sigma=-0.1"], ["sigma", "> 0"]),
    (["--set", "options.population=18"], ["population (18)", "subspaces (4)"]),
    (["--set", "problem.name=nope"], ["'name'", "rastrigin"]),
    (["--set", "problem.kind=quantum"], ["problem.kind 'quantum'"]),
    (["--set", "problem.dimension=3", "--set", "problem.x0=[1, 2]"], ["problem.x0", "3"]),
    (["--set", "problem.shift=[1, 2]"], ["shift"]),
    (["--set", "budget.max_evaluations=null"], ["budget.max_steps"]),
    (["--set", "nokey"], ["KEY=VALUE"]),
    (["--config", "missing.yaml"], ["missing.yaml", "does not exist"]),
    (["--set", "problem.kind=callable"], ["problem.target"]),
    (["--set", "problem={kind: callable, target: no_such_mod:f}"], ["no_such_mod"]),
    (["--set", "problem={kind: callable, target: numpy:nothing}"], ["nothing"]),
    (["--set", "problem={kind: callable, target: gone.py:f}"], ["gone.py"]),
    (["--set", "output.dir=runs/{nope}"], ["{nope}"]),
]


@pytest.mark.parametrize(("args", "words"), ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_bad_input_exits_2_naming_the_key(tmp_path, args, words):
    result = invoke("optimize", "-q", *args, cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output
    assert not (tmp_path / "runs").exists()


def test_malformed_yaml_names_its_line(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("strategy: copes\noptions:\n  population: 8\n   sigma: 0.1\n")
    result = invoke("optimize", "-c", str(config))
    assert result.exit_code == 2
    assert "bad.yaml: malformed YAML at line 4" in result.output


def test_errors_in_a_real_process_have_no_traceback(tmp_path):
    done = subprocess.run(
        [*ESBOX, "optimize", "--set", "options.population=18"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Error: population (18) must be divisible by subspaces (4)" in done.stderr
    assert "Traceback" not in done.stderr


# -- resume -------------------------------------------------------------------------------------
def _slow_config(tmp_path: Path) -> Path:
    (tmp_path / "slow.py").write_text(SLOW_FUNCTION)
    config = tmp_path / "slow.yaml"
    config.write_text(
        f"strategy: copes\nseed: 5\n"
        f"options: {{population: 8, subspaces: 2, sigma: 0.1, learning_rate: 0.05}}\n"
        f"problem: {{kind: callable, target: '{tmp_path / 'slow.py'}:slow_sphere', "
        f"x0: 0.0, dimension: 20}}\n"
        f"budget: {{max_steps: 70}}\ncheckpoint: {{every: 5}}\n"
    )
    return config


def _start(config: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*ESBOX, "optimize", "-q", "-c", str(config), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_steps(out: Path, steps: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metrics = out / "metrics.jsonl"
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= steps:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    raise AssertionError("the run did not progress")


def test_resume_after_kill_9_is_bit_identical(tmp_path):
    config = _slow_config(tmp_path)
    killed = tmp_path / "killed"
    process = _start(config, killed)
    _wait_for_steps(killed, 22, process)
    assert process.poll() is None  # killed mid-run, not after it ended
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert not (killed / "summary.json").exists()
    assert len(read_metrics(killed / "metrics.jsonl")) < 70
    result = run_ok("resume", "-q", str(killed))
    assert "after 70 steps" in result.output
    run_ok("optimize", "-q", "-c", str(config), "--out", str(tmp_path / "straight"))
    same_run(killed, tmp_path / "straight")
    assert json.loads((killed / "summary.json").read_text())["resumed"] is True


def test_ctrl_c_writes_a_checkpoint_and_resume_continues(tmp_path):
    config = _slow_config(tmp_path)
    out = tmp_path / "interrupted"
    process = _start(config, out)
    _wait_for_steps(out, 12, process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert "esbox resume" in stderr and "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] < 70
    step = int((out / "checkpoints" / "latest").read_text().split("-")[1])
    assert step == summary["steps"]  # the checkpoint is of the interrupted step, not an older one
    run_ok("resume", "-q", str(out))
    run_ok("optimize", "-q", "-c", str(config), "--out", str(tmp_path / "straight"))
    same_run(out, tmp_path / "straight")


def test_interrupt_during_an_update_is_held_until_the_step_ends(tmp_path):
    from esbox.cli.run import execute, prepare, resolve_config, write_config
    from esbox.runconfig import apply_overrides

    config = resolve_config(apply_overrides({}, TINY[1::2]))
    session = prepare(config)
    apply, calls = session.problem.space.apply, []

    def apply_and_interrupt(update):
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C after tell(), before the update
        calls.append(update)
        return apply(update)

    session.problem.space.apply = apply_and_interrupt
    out = tmp_path / "run"
    out.mkdir()
    write_config(out, config)
    summary = execute(session, out, quiet=True, resume=False)
    assert summary["status"] == "interrupted"
    assert summary["steps"] == 4 and summary["evaluations"] == 4 * 8
    # the interrupt came before the step's callbacks: its metrics line is written all the same
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [0, 1, 2, 3]
    run_ok("resume", "-q", str(out))
    run_ok("optimize", "-q", *TINY, "--out", str(tmp_path / "straight"))
    same_run(out, tmp_path / "straight")


def test_resume_can_extend_the_budget(tmp_path):
    short, long = tmp_path / "short", tmp_path / "long"
    run_ok("optimize", "-q", *TINY, "--out", str(short))
    result = run_ok("resume", "-q", str(short), "--set", "budget.max_steps=25")
    assert "after 25 steps" in result.output
    assert "max_steps: 25" in (short / "config.yaml").read_text()
    run_ok("optimize", "-q", *TINY, "--set", "budget.max_steps=25", "--out", str(long))
    same_run(short, long)


@pytest.mark.parametrize(
    ("setup", "args", "words"),
    [
        (None, ["resume", "nowhere"], ["nowhere", "does not exist"]),
        ("empty", ["resume", "{dir}"], ["config.yaml", "run directory"]),
        ("nockpt", ["resume", "{dir}"], ["cannot resume", "no checkpoint", "--overwrite"]),
        ("run", ["resume", "{dir}", "--set", "options.sigma=1"], ["budget.*", "options.sigma"]),
        ("run", ["resume", "{dir}", "--set", "budget.max_stepz=1"], ["max_stepz", "max_steps"]),
    ],
)
def test_resume_errors(tmp_path, setup, args, words):
    run_dir = tmp_path / "run"
    if setup == "empty":
        run_dir.mkdir()
    elif setup == "nockpt":
        run_ok("optimize", "-q", *TINY, "--set", "checkpoint.every=0", "--out", str(run_dir))
        (run_dir / "checkpoints").mkdir(exist_ok=True)
    elif setup == "run":
        run_ok("optimize", "-q", *TINY, "--out", str(run_dir))
    result = invoke(*[a.replace("{dir}", str(run_dir)) for a in args], cwd=tmp_path)
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.output


# -- report -------------------------------------------------------------------------------------
def test_report_overlays_two_runs(tmp_path):
    a, b = tmp_path / "copes", tmp_path / "openai"
    run_ok("optimize", "-q", *TINY, "--out", str(a))
    run_ok("optimize", "-q", *TINY, "--strategy", "openai_es", "--out", str(b))
    result = run_ok("report", str(a), str(b), "--out", str(tmp_path / "report"))
    for name in ("reward.png", "best.png"):
        png = (tmp_path / "report" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000
    lines = [line for line in result.output.splitlines() if line.startswith("| ")]
    assert len(lines) == 3 and "copes" in lines[1] and "openai_es" in lines[2]
    assert "| 15 | 120 |" in lines[1]
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "![best](best.png)" in markdown and lines[1] in markdown


def test_report_on_a_killed_run_with_a_torn_line(tmp_path):
    out = tmp_path / "run"
    run_ok("optimize", "-q", *TINY, "--out", str(out))
    (out / "summary.json").unlink()
    with (out / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 15, "evalu')
    result = run_ok("report", str(out))
    assert "running or killed" in result.output
    assert (out / "report" / "reward.png").is_file()


def test_report_errors(tmp_path):
    result = invoke("report", str(tmp_path / "none"))
    assert result.exit_code == 2 and "does not exist" in result.output
    result = invoke("report", str(tmp_path))
    assert result.exit_code == 2 and "metrics.jsonl" in result.output
    result = invoke("report")
    assert result.exit_code == 2


# -- strategies, help, docs, examples -------------------------------------------------------------
def test_strategies_lists_every_registered_strategy():
    import esbox

    result = run_ok("strategies")
    for name, cls in esbox.available_strategies().items():
        assert name in result.output and cls.description in result.output
    assert "subspaces=4" in result.output


def test_strategies_shows_one_in_full():
    result = run_ok("strategies", "copes")
    assert "subspaces" in result.output and "joint | per_subspace" in result.output
    assert "sigma_k = sqrt(K) sigma" in result.output
    result = invoke("strategies", "copse")
    assert result.exit_code == 2 and "did you mean 'copes'" in result.output


def test_help_teaches_the_main_options():
    result = run_ok("optimize", "--help")
    for word in ("--config", "--set", "--out", "--quiet", "Examples:", "options.sigma", "budget."):
        assert word in result.output
    assert all(cmd in run_ok("--help").output for cmd in ("optimize", "resume", "report"))


def test_docs_cover_every_command_and_key():
    text = (ROOT / "docs" / "cli.md").read_text()
    commands = ("optimize", "resume", "report", "strategies", "evaluate", "convert-model", "memory")
    for command in (f"esbox {name}" for name in commands):
        assert command in text
    for row in config_reference(problem_options()):
        assert f"`{row['key']}`" in text, f"docs/cli.md does not document {row['key']}"
    assert reference.block() in text, "docs/cli.md is stale: run python -m esbox.cli.reference"
    for flag in ("--config", "--set", "--out", "--overwrite", "--quiet", "--dry-run", "--seed"):
        assert flag in text


# LLM and agent examples load the shipped model: tests/test_agents.py and test_agent_examples.py
# run the agent ones on a tiny model instead
EXAMPLES = sorted(
    p for p in (ROOT / "examples").glob("*.yaml") if not p.name.startswith(("llm-", "agent-"))
)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_run(tmp_path, path):
    run_ok(
        "optimize",
        "-q",
        "-c",
        str(path),
        "--set",
        "budget.max_steps=2",
        "--out",
        str(tmp_path / "run"),
    )


def test_metrics_logger_writes_strict_json(tmp_path):
    logger = MetricsLogger(tmp_path / "m.jsonl")
    logger(None, {"step": 0, "reward_mean": float("nan"), "best_value": float("inf"), "x": 1})
    logger.rewrite([{"step": 0, "reward_mean": 1.0}, {"step": 1, "extra": np.float32(2)}])
    logger(None, {"step": 2})
    logger.close()
    text = (tmp_path / "m.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    rows = read_metrics(tmp_path / "m.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[1]["extra"] == 2.0
    assert rows[0]["best_value"] is None and list(rows[0])[: len(FIELDS)] == list(FIELDS)
