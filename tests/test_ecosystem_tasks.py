"""Tasks from local files and from ``datasets``: every source gives the same task, columns map
a task's fields to the data's names, bad input names what is wrong, and a run config whose
task is a dataset saved to disk trains from the shell (on the tiny test model)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from esbox.adapters.tasks import load_task
from esbox.cli.main import cli
from esbox.errors import ConfigError

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = [{"problem": f"What is {i} + 1?", "solution": f"#### {i + 1}"} for i in range(12)]
COLUMNS = {"question": "problem", "answer": "solution"}


def write_files(folder: Path) -> dict[str, Path]:
    """The rows as JSONL, JSON, Parquet and CSV files, and as ``save_to_disk`` directories (a
    Dataset, and a DatasetDict of train/test)."""
    paths = {kind: folder / f"rows.{kind}" for kind in ("jsonl", "json", "parquet", "csv")}
    paths["jsonl"].write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    paths["json"].write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), paths["parquet"])
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    dataset = datasets.Dataset.from_list(ROWS)
    paths["saved"] = folder / "saved"
    dataset.save_to_disk(str(paths["saved"]))
    paths["saved_dict"] = folder / "saved_dict"
    splits = {"train": dataset.select(range(9)), "test": dataset.select(range(9, 12))}
    datasets.DatasetDict(splits).save_to_disk(str(paths["saved_dict"]))
    return paths


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return write_files(tmp_path_factory.mktemp("data"))


def contents(task) -> tuple[list, list]:
    """What a task trains and is scored on: (prompt, gold answer) of each split."""
    return tuple([(e.prompt, e.answer) for e in split] for split in (task.train, task.heldout))


def reference(files: dict[str, Path]) -> tuple[list, list]:
    return contents(load_task({**COMMON, "kind": "math", "path": str(files["jsonl"])}))


COMMON = {"columns": COLUMNS, "heldout_size": 3, "seed": 1}


@pytest.mark.parametrize("kind", ["json", "parquet", "csv", "saved"])
def test_every_file_gives_the_same_task(files, kind: str) -> None:
    train, heldout = reference(files)
    assert len(train) == 9 and len(heldout) == 3 and heldout[0][1] == "5"  # "#### 5" -> "5"
    assert contents(load_task({**COMMON, "kind": "math", "path": str(files[kind])})) == (
        train,
        heldout,
    )


@pytest.mark.parametrize(
    ("builder", "kind"), [("json", "jsonl"), ("csv", "csv"), ("parquet", "parquet")]
)
def test_a_builder_over_local_files_gives_the_same_task(files, builder: str, kind: str) -> None:
    spec = {"kind": "datasets", "name": builder, "data_files": {"train": str(files[kind])}}
    assert contents(load_task({**COMMON, **spec})) == reference(files)


def test_the_splits_of_a_saved_dataset_dict(files) -> None:
    spec = {"kind": "math", "path": str(files["saved_dict"]), "columns": COLUMNS}
    task = load_task({**spec, "heldout_split": "test"})
    assert [len(task.train), len(task.heldout)] == [9, 3]
    assert [e.answer for e in task.heldout] == ["10", "11", "12"]
    qa = load_task(
        {
            **spec,
            "kind": "qa",
            "columns": {"question": "problem", "answers": "solution"},
            "split": "test",
            "heldout_size": 1,
        }
    )
    assert [len(qa.train), len(qa.heldout)] == [2, 1]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {"kind": "math", "path": "saved"},
            ["no column 'question' for the question", "its columns: problem, solution"],
        ),
        (
            {"kind": "math", "path": "saved_dict", "columns": COLUMNS, "heldout_split": "tset"},
            ["unknown split", "'tset'; did you mean 'test'?", "allowed: test, train"],
        ),
        (
            {"kind": "qa", "path": "csv", "columns": {"question": "problem", "answer": "x"}},
            ["unknown qa task column field 'answer'", "allowed: answers, context, question"],
        ),
        (
            {"kind": "math", "path": "jsonl", "columns": {"question": "problem"}},
            ["no column 'answer' for the answer", "columns: {answer: COLUMN, ...}"],
        ),
        (
            {"kind": "math", "path": "jsonl", "columns": COLUMNS, "answer_key": "solution"},
            ["columns.answer and answer_key both name"],
        ),
        ({"kind": "math", "path": "missing.jsonl"}, ["missing.jsonl does not exist"]),
        ({"kind": "math", "path": "notes.txt"}, ["unknown file type '.txt'", ".jsonl, .json"]),
        ({"kind": "math", "path": "."}, ["not a dataset saved with datasets' save_to_disk"]),
        (
            {"kind": "datasets", "name": "jsn", "data_files": "jsonl"},
            ["task name 'jsn' is not a datasets builder; did you mean 'json'?"],
        ),
        (
            {"kind": "datasets", "name": "json", "data_files": "missing.jsonl"},
            ["task name 'json'", "missing.jsonl", "could not be loaded"],
        ),
        (
            {"kind": "datasets", "name": "json", "data_files": "jsonl", "format": "maths"},
            ["task format must be 'math' or 'qa', got 'maths'"],
        ),
    ],
)
def test_bad_input_names_what_is_wrong(files, spec: dict, words: list[str]) -> None:
    folder = files["jsonl"].parent
    (folder / "notes.txt").write_text("not rows\n")
    for key in ("path", "data_files"):
        if key in spec:
            spec = {**spec, key: str(files.get(spec[key], folder / spec[key]))}
    with pytest.raises(ConfigError) as info:
        load_task(spec)
    for word in words:
        assert word in str(info.value)


def llm_run(model: Path, out: Path, task: str) -> list[str]:
    """``esbox optimize`` of the tiny model on ``task`` for two steps of four members."""
    sets = {
        "problem.kind": "llm",
        "problem.model": str(model),
        "problem.batch_size": 2,
        "problem.task": task,
        "problem.max_new_tokens": 4,
        "options.population": 4,
        "options.subspaces": 2,
        "budget.max_steps": 2,
        "budget.max_evaluations": "null",
    }
    args = ["optimize", "-q", "--strategy", "copes", "--out", str(out)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    return args


def test_a_run_config_trains_on_a_dataset_saved_to_disk(files, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from esbox.adapters.models.testing import save_tiny_lm

    model = save_tiny_lm(tmp_path / "tiny")
    task = (
        f"{{kind: math, path: {files['saved_dict']}, heldout_split: test, "
        f"columns: {{question: problem, answer: solution}}}}"
    )
    result = CliRunner().invoke(cli, llm_run(model, tmp_path / "run", task))
    assert result.exit_code == 0, result.output
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == [0, 1]
    wrong = task.replace("answer: solution", "answer: answer_text")
    result = CliRunner().invoke(cli, llm_run(model, tmp_path / "bad", wrong))
    assert result.exit_code == 2
    assert "no column 'answer_text' for the answer; its columns: problem, solution" in result.output
