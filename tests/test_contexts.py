"""ESOpt context co-evolution on an LLM: rollouts under each member's context, the model as
proposer, and the whole loop from a YAML config (metrics, summary, bit-identical resume)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch
import yaml
from click.testing import CliRunner
from safetensors.torch import load_file

import esbox
from esbox.adapters.models.testing import save_tiny_lm
from esbox.adapters.problems.llm import LLMProblemOptions, build_llm
from esbox.adapters.tasks import ArithmeticTask
from esbox.adapters.tasks.proposers import ModelContextProposer, clean_context, meta_prompt
from esbox.checkpoint import latest_checkpoint
from esbox.cli.main import cli
from esbox.resources import MEASURED_FIELDS
from esbox.runner import Budget, Runner

ROOT = Path(__file__).resolve().parent.parent
TASK = {"kind": "arithmetic", "train_size": 20, "heldout_size": 4}


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture
def varied_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reward that tells completions apart (a random tiny model never gets a sum right)."""
    monkeypatch.setattr(
        ArithmeticTask, "reward", lambda self, completion, example: sum(map(ord, completion)) % 11
    )


def llm_run(model: Path, **options):
    defaults = dict(model=str(model), task=TASK, batch_size=2, validation_every=0)
    return build_llm(LLMProblemOptions(**{**defaults, **options}), seed=0)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class SpyBackend:
    """Records the prompts of every call, then generates with the real backend."""

    def __init__(self, inner) -> None:
        self.inner, self.prompts = inner, []

    def generate(self, prompts, **kwargs):
        self.prompts.append(list(prompts))
        return self.inner.generate(prompts, **kwargs)


class CannedBackend:
    """Answers every call with the same text and records the call."""

    def __init__(self, text: str) -> None:
        self.text, self.calls = text, []

    def generate(self, prompts, **kwargs):
        self.calls.append((list(prompts), kwargs))
        return [self.text] * len(prompts)


# -- rollouts under the member's context ---------------------------------------------------------
def test_each_member_rolls_out_under_its_current_context_text(tiny_lm) -> None:
    run = llm_run(tiny_lm)
    spy = run.evaluator.backend = SpyBackend(run.evaluator.backend)
    es = esbox.make_strategy("esopt", run.space, population=4, contexts=["Be terse.", "Be exact."])
    run.attach(es)
    members = es.ask()
    run.evaluator.evaluate(run.space, members)
    assert len(spy.prompts) == 4
    for p, prompts in zip(members, spy.prompts, strict=True):
        system = {"role": "system", "content": es.contexts[p.context]}
        assert [m[0] for m in prompts] == [system, system]
        assert all(m[1]["role"] == "user" for m in prompts)
    es.contexts[1] = "A proposal."  # what the proposer does to the worst context
    spy.prompts.clear()
    run.evaluator.evaluate(run.space, members)
    systems = [prompts[0][0]["content"] for prompts in spy.prompts]
    assert systems == ["Be terse.", "A proposal.", "Be terse.", "A proposal."]


def test_a_strategy_without_contexts_leaves_the_prompts_alone(tiny_lm) -> None:
    run = llm_run(tiny_lm)
    spy = run.evaluator.backend = SpyBackend(run.evaluator.backend)
    es = esbox.make_strategy("openai_es", run.space, population=2)
    run.attach(es)
    run.evaluator.evaluate(run.space, es.ask())
    assert run.evaluator.context_of is None
    assert all(m[0]["role"] == "user" for prompts in spy.prompts for m in prompts)


# -- the proposer --------------------------------------------------------------------------------
def test_proposer_replaces_the_worst_context_with_the_cleaned_model_output() -> None:
    backend = CannedBackend('  ```text\n"Add the digits, then check."\n```\n')
    proposer = ModelContextProposer(backend, max_new_tokens=7)
    es = esbox.make_strategy(
        "esopt", 4, population=6, contexts=["a", "b", "c"], context_proposer=proposer
    )
    es.ask()
    es.tell(np.array([1.0, 5.0, 0.0, 3.0, 7.0, 2.0]))  # scores a: 2, b: 6, c: 1
    assert es.contexts == ["a", "b", "Add the digits, then check."]
    [(prompts, kwargs)] = backend.calls
    assert kwargs["max_new_tokens"] == 7 and kwargs["greedy"] is True and kwargs["seed"] is None
    system, user = prompts[0]
    assert system["role"] == "system" and user["role"] == "user"
    request = user["content"]
    assert request.endswith("\n\nb\n\nReply with the rewritten instructions only.")  # best: b
    assert "these scored 6.000" in request
    assert request.index('"a" scored 2.000') < request.index('"c" scored 1.000')  # best first
    assert es.metrics["context_best"] == 1 and es.metrics["context_best_score"] == 6.0
    assert es.metrics["context_best_chars"] == 1


def test_with_tied_scores_the_best_context_is_kept() -> None:
    es = esbox.make_strategy(
        "esopt", 4, population=4, contexts=["a", "b"], context_proposer=lambda *_: "new"
    )
    es.ask()
    es.tell(np.ones(4))
    assert es.contexts == ["a", "new"] and es.best_context == "a"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Be brief.\n", "Be brief."),
        ("", "BEST"),
        (" \n\t ", "BEST"),
        ("```\n\n```", "BEST"),
        ("'Quoted.'", "Quoted."),
        ("one two three four", "one two"),  # cut at a word within 10 characters
        ("abcdefghijklmn", "abcdefghij"),  # no word boundary: a hard cut
    ],
)
def test_clean_context(text: str, expected: str) -> None:
    assert clean_context(text, "BEST", max_chars=10) == expected


def test_sampling_proposer_is_seeded_by_its_request() -> None:
    backend = CannedBackend("x")
    proposer = ModelContextProposer(backend, temperature=0.7, seed=3)
    proposer("a", ["a", "b"], [1.0, 0.0])
    proposer("a", ["a", "b"], [1.0, 0.0])
    proposer("a", ["a", "b"], [1.0, 0.5])
    seeds = [kwargs["seed"] for _, kwargs in backend.calls]
    assert seeds[0] == seeds[1] != seeds[2] and not backend.calls[0][1]["greedy"]
    assert backend.calls[0][1]["temperature"] == 0.7


def test_meta_prompt_marks_unscored_contexts() -> None:
    text = meta_prompt("a", ["a", "b"], [0.5, float("nan")])
    assert '"b" is not scored yet' in text and "these scored 0.500" in text


def test_model_proposer_runs_on_the_unperturbed_weights(tiny_lm, varied_reward) -> None:
    run = llm_run(tiny_lm, context_proposer="model", proposer_max_new_tokens=8)
    es = esbox.make_strategy(
        "esopt", run.space, population=4, sigma=0.05, learning_rate=0.05, contexts=["x", "y"]
    )
    run.attach(es)
    assert isinstance(es.context_proposer, ModelContextProposer)
    proposer, seen, proposals = es.context_proposer, [], []

    def spy(best, contexts, scores):
        seen.append(weights(run.model))
        proposals.append(proposer(best, contexts, scores))
        return proposals[-1]

    es.context_proposer = spy
    before = weights(run.model)
    Runner(run.space, es, run.evaluator, Budget(max_steps=1)).run()
    assert len(seen) == 1 and all(torch.equal(seen[0][k], v) for k, v in before.items())
    assert any(not torch.equal(before[k], v) for k, v in weights(run.model).items())
    assert es.best_context in ("x", "y") and set(es.contexts) == {es.best_context, proposals[0]}


# -- from a YAML config --------------------------------------------------------------------------
def esopt_config(model: Path, out: Path, steps: int) -> dict:
    """examples/llm-arith-esopt.yaml, shrunk to the tiny model and a few steps."""
    config = yaml.safe_load((ROOT / "examples" / "llm-arith-esopt.yaml").read_text())
    config["options"].update(
        population=4, sigma=0.05, learning_rate=0.05, evolve_every=1, contexts=["x", "y"]
    )
    config["problem"].update(
        model=str(model), task=TASK, batch_size=2, validation_every=0, proposer_max_new_tokens=8
    )
    config["budget"] = {"max_steps": steps, "max_evaluations": None, "max_seconds": None}
    config["checkpoint"] = {"every": 1}
    config["output"] = {"dir": str(out)}
    return config


def optimize(config: dict, path: Path, *args: str):
    path.write_text(yaml.safe_dump(config))
    return CliRunner().invoke(cli, ["optimize", "-q", "-c", str(path), *args])


def rows(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [{k: v for k, v in row.items() if k not in MEASURED_FIELDS} for row in rows]


def test_optimize_coevolves_contexts_logs_them_and_keeps_the_best(
    tiny_lm, tmp_path, varied_reward
) -> None:
    run = tmp_path / "run"
    result = optimize(esopt_config(tiny_lm, run, steps=3), tmp_path / "c.yaml")
    assert result.exit_code == 0, result.output
    metrics = rows(run)
    assert len(metrics) == 3
    for row in metrics:
        assert row["context_best"] in (0, 1) and row["context_best_chars"] >= 1
        assert isinstance(row["context_best_score"], float)
    summary = json.loads((run / "summary.json").read_text())
    texts = [c["text"] for c in summary["contexts"]]
    assert len(texts) == 2 and texts != ["x", "y"]  # the model replaced the worst one
    assert summary["best_context"] in texts
    assert (run / "best_context.txt").read_text() == summary["best_context"] + "\n"
    assert "best context" in result.output
    state = json.loads((latest_checkpoint(run / "checkpoints") / "state.json").read_text())
    assert state["strategy"]["extra"]["contexts"] == texts


def test_optimize_with_contexts_resumes_bit_identically(tiny_lm, tmp_path, varied_reward) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert optimize(esopt_config(tiny_lm, straight, 4), tmp_path / "a.yaml").exit_code == 0
    assert optimize(esopt_config(tiny_lm, split, 2), tmp_path / "b.yaml").exit_code == 0
    resumed = CliRunner().invoke(cli, ["resume", "-q", str(split), "--set", "budget.max_steps=4"])
    assert resumed.exit_code == 0, resumed.output
    assert rows(straight) == rows(split)
    a, b = (json.loads((r / "summary.json").read_text()) for r in (straight, split))
    assert a["contexts"] == b["contexts"] and a["best_context"] == b["best_context"]
    wa, wb = (load_file(str(r / "model" / "model.safetensors")) for r in (straight, split))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(row["update_norm"] > 0 for row in rows(straight))


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["strategy=copes", "options={contexts: [a, b]}"],
            "options.contexts is an option of strategy esopt",
        ),
        (["strategy=copes", "problem.context_proposer=model"], "does not co-evolve contexts"),
        (["options={contexts: []}", "problem.context_proposer=model"], "at least 2"),
        (["options={contexts: [a]}", "problem.context_proposer=model"], "at least 2"),
        (
            ["options={population: 2, contexts: [a, b, c]}"],
            "population (2) must be at least the number of contexts (3)",
        ),
    ],
)
def test_bad_context_configs_fail_before_the_model_loads(tmp_path, sets, message) -> None:
    args = ["optimize", "-q", "--strategy", "esopt", "--out", str(tmp_path / "r")]
    args += ["--set", "problem={kind: llm, model: no/such/model}"]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "r").exists()
