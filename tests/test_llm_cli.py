"""The LLM path from the shell: optimize with ``kind: llm``, resume, evaluate — on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from click.testing import CliRunner
from safetensors.torch import load_file

from esbox.adapters.models.testing import save_tiny_lm
from esbox.cli.main import cli


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-llama")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def llm_args(model: Path, out: Path, steps: int = 3) -> list[str]:
    sets = {
        "problem.kind": "llm",
        "problem.model": str(model),
        "problem.batch_size": 2,
        "problem.task": "{kind: arithmetic, train_size: 20, heldout_size: 4}",
        "problem.validation_every": 2,
        "options.population": 4,
        "options.subspaces": 2,
        "options.sigma": 0.01,
        "options.learning_rate": 0.001,
        "budget.max_steps": steps,
        "budget.max_evaluations": "null",
        "checkpoint.every": 1,
    }
    args = ["optimize", "-q", "--strategy", "copes", "--out", str(out)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args


def test_optimize_llm_writes_model_metrics_and_validation(tiny_lm, tmp_path):
    result = invoke(*llm_args(tiny_lm, tmp_path / "run"))
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    saved = load_file(str(run / "model" / "model.safetensors"))
    assert "model.embed_tokens.weight" in saved
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and "val_accuracy" in rows[1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["baseline"]["val_step"] == 0 and "val_accuracy" in summary["baseline"]
    report = invoke("report", str(run), "--out", str(tmp_path / "report"))
    assert report.exit_code == 0, report.output
    assert (tmp_path / "report" / "validation.png").stat().st_size > 10_000
    assert " → " in report.output  # held-out accuracy from the baseline to the last check


def test_llm_resume_is_bit_identical(tiny_lm, tmp_path):
    assert invoke(*llm_args(tiny_lm, tmp_path / "straight", steps=4)).exit_code == 0
    assert invoke(*llm_args(tiny_lm, tmp_path / "split", steps=2)).exit_code == 0
    resumed = invoke("resume", "-q", str(tmp_path / "split"), "--set", "budget.max_steps=4")
    assert resumed.exit_code == 0, resumed.output
    a = load_file(str(tmp_path / "straight" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_bad_task_option_exits_2_naming_the_key(tiny_lm, tmp_path):
    bad_task = "problem.task={kind: arithmetic, digts: 3}"
    args = [*llm_args(tiny_lm, tmp_path / "bad"), "--set", bad_task]
    result = invoke(*args)
    assert result.exit_code == 2 and "digts" in result.output


def test_evaluate_prints_accuracy_and_pass_at_k(tiny_lm, tmp_path):
    out = tmp_path / "eval.json"
    result = invoke(
        "evaluate",
        "--model",
        str(tiny_lm),
        "--task",
        "{kind: arithmetic, train_size: 10, heldout_size: 6}",
        "--samples",
        "2",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["n"] == 6 and 0.0 <= figures["pass@2"] <= 1.0 and "| accuracy |" in result.output


def test_evaluate_rejects_a_task_without_kind(tiny_lm):
    result = invoke("evaluate", "--model", str(tiny_lm), "--task", "{path: x.jsonl}")
    assert result.exit_code == 2 and "kind" in result.output


def test_memory_prints_es_grpo_and_lora_columns(tiny_lm):
    result = invoke("memory", "--model", str(tiny_lm), "--context", "128k", "--subspaces", "4")
    assert result.exit_code == 0, result.output
    assert "ES (esbox, CoPES K=4)" in result.output and "GRPO (full)" in result.output
    assert "LoRA-GRPO" in result.output
    bad = invoke("memory", "--model", str(tiny_lm), "--context", "lots")
    assert bad.exit_code == 2 and "lots" in bad.output


EXAMPLE = Path(__file__).parent.parent / "examples" / "llm-arith.yaml"


def test_memory_from_a_run_config_uses_its_es_settings(tiny_lm):
    from esbox.partition import pattern_length

    args = ["memory", "-c", str(EXAMPLE), "--set", f"problem.model={tiny_lm}", "--json"]
    args += ["--set", "problem.chunk_size=1000", "--set", "problem.dtype=bfloat16"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    estimate = json.loads(result.output)
    assert (estimate["batch"], estimate["dtype"]) == (16, "bfloat16")  # batch_size, --set
    assert (estimate["subspaces"], estimate["noise"], estimate["chunk"]) == (4, "table", 1000)
    es = estimate["methods"]["es"]["items"]
    assert es["noise table"] == 4 * 8388608  # the config's table_size
    assert es["partition pattern (CoPES)"] == 2 * pattern_length(4, 1000)
    assert "Adam moments" not in es
    adam = invoke(*args, "--set", "options.optimizer=adam")
    assert "Adam moments" in json.loads(adam.output)["methods"]["es"]["items"]


def test_memory_config_errors_name_what_to_do(tiny_lm, tmp_path):
    model = f"problem.model={tiny_lm}"
    both = invoke("memory", "-c", str(EXAMPLE), "--model", str(tiny_lm))
    assert both.exit_code == 2 and "exactly one of --model and --config" in both.output
    flag = invoke("memory", "-c", str(EXAMPLE), "--set", model, "--dtype", "float16")
    assert flag.exit_code == 2 and "--set problem.dtype=" in flag.output
    loose = invoke("memory", "--model", str(tiny_lm), "--set", "problem.dtype=float16")
    assert loose.exit_code == 2 and "--set needs --config" in loose.output
    function = tmp_path / "f.yaml"
    function.write_text("problem: {kind: function, name: sphere, dimension: 3}\n")
    wrong = invoke("memory", "-c", str(function))
    assert wrong.exit_code == 2 and "problem.kind: llm" in wrong.output
    typo = invoke("memory", "-c", str(EXAMPLE), "--set", model, "--set", "problem.nois=table")
    assert typo.exit_code == 2 and "nois" in typo.output


def test_memory_without_transformers_is_a_clear_error(tiny_lm, monkeypatch):
    from esbox.adapters.models import shapes as model_shapes

    def missing():
        raise ImportError("esbox's LLM adapters need transformers; install the LLM extra")

    monkeypatch.setattr(model_shapes, "require_transformers", missing)
    for args in (
        ["--model", str(tiny_lm)],
        ["-c", str(EXAMPLE), "--set", f"problem.model={tiny_lm}"],
    ):
        result = invoke("memory", *args)
        assert result.exit_code == 2 and "install the LLM extra" in result.output


def test_noise_table_size_reaches_the_space_and_must_hold_a_chunk(tiny_lm, tmp_path):
    from esbox.adapters.problems.llm import LLMProblemOptions, build_llm

    options = LLMProblemOptions(
        model=str(tiny_lm),
        task={"kind": "arithmetic", "train_size": 4, "heldout_size": 2},
        chunk_size=1024,
        noise="table",
        table_size=4096,
    )
    assert build_llm(options, seed=0).space.state_dict()["noise_table_size"].item() == 4096
    args = [*llm_args(tiny_lm, tmp_path / "bad"), "--set", "problem.noise=table"]
    result = invoke(*args, "--set", "problem.chunk_size=8192", "--set", "problem.table_size=4096")
    assert result.exit_code == 2
    assert "problem.table_size (4096) must be at least problem.chunk_size (8192)" in result.output


def test_load_run_builds_the_example_config_exactly_as_the_cli_does(tiny_lm, tmp_path):
    """A Python user gets the CLI's problem from the same YAML: same weights after the run."""
    from esbox.adapters.problems import load_run
    from esbox.adapters.tasks import RolloutEvaluator

    sets = [
        f"problem.model={tiny_lm}",
        "problem.task={kind: arithmetic, train_size: 20, heldout_size: 4}",
        "problem.batch_size=2",
        "problem.validation_every=0",
        "options.population=4",
        "budget.max_steps=2",
    ]
    session = load_run(EXAMPLE, sets)
    assert isinstance(session.problem.evaluator, RolloutEvaluator)
    assert session.strategy.name == "copes" and session.strategy.options.subspaces == 4
    assert session.runner().run() == "max_steps"
    flags = [item for s in sets for item in ("--set", s)]
    result = invoke("optimize", "-q", "-c", str(EXAMPLE), "--out", str(tmp_path / "cli"), *flags)
    assert result.exit_code == 0, result.output
    saved = load_file(str(tmp_path / "cli" / "model" / "model.safetensors"))
    ours = session.problem.space.module.state_dict()
    assert saved and all((ours[k] == saved[k]).all() for k in saved)
