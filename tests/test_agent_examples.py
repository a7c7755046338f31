"""The agent examples end to end on a tiny model: the search agent of examples/agent-qa.yaml, and
ESOpt co-evolving an agent's skill texts (the Agents block of docs/contexts.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("bm25s")

import yaml
from click.testing import CliRunner

from esbox.adapters.generation.backend import RenderedPrompt
from esbox.adapters.models.testing import char_tokenizer, save_tiny_lm
from esbox.adapters.problems import load_run
from esbox.checkpoint import latest_checkpoint
from esbox.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
QA_EXAMPLE = ROOT / "examples" / "agent-qa.yaml"
SEARCH_PREFILL = '<tool_call>{"name": "search", "arguments": {"query": "'
TINY = [  # what shrinks an example to the tiny model and one quick step
    "problem.dtype=float32", "problem.batch_size=2", "problem.table_size=65536",
    "problem.chunk_size=65536", "problem.validation_limit=2", "problem.task.heldout_size=2",
    "budget.max_steps=1",
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    # a character a token: the worked example, the tool prompt and two searches fit in 4096
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=4096)


def optimize(config: Path, out: Path, *sets: str):
    args = ["optimize", "-q", "-c", str(config), "--out", str(out)]
    for item in sets:
        args += ["--set", item]
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]


# -- examples/agent-qa.yaml --------------------------------------------------------------------
def test_the_qa_agent_example_runs_on_a_tiny_model_and_searches(tiny_lm, tmp_path):
    run = tmp_path / "run"
    result = optimize(
        QA_EXAMPLE, run, f"problem.model={tiny_lm}", "options.population=4",
        "options.subspaces=2", *TINY,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = records(run)
    assert len(rows) == 4 and {r["member"] for r in rows} == {0, 1, 2, 3}
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles[:4] == ["system", "user", "assistant", "tool"]  # the worked example first
        assert row["messages"][2]["content"].startswith(SEARCH_PREFILL) and row["calls"] >= 1
        assert '"name": "search"' in row["system"] and "Harwick Labs" in row["system"]
        assert '"name": "calculator"' not in row["system"]  # search is the only tool
    (metrics,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics["agent_tool_call_rate"] == 1.0


class SearchingBackend:
    """A competent agent: searches the question's entity, then the one the first result names,
    then answers with what the second result says (it knows the task's records)."""

    def __init__(self, task) -> None:
        self.tokenizer = char_tokenizer()
        self.examples = [*task.train, *task.heldout]
        self.queries: list[str] = []

    def turn(self, prompt: str, prefill: str | None) -> str:
        example = next(e for e in self.examples if e.prompt[-1]["content"] in prompt)
        entity, bridge = example.meta["supporting"]
        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
        if not results:
            self.queries.append(entity)
            assert prefill == SEARCH_PREFILL  # the example opens the first search
            return f'{entity}"}}}}'
        if len(results) == 1:
            assert bridge in results[0], results[0]  # the first hop's document came back
            self.queries.append(bridge)
            return f'<tool_call>{{"name": "search", "arguments": {{"query": "{bridge}"}}}}'
        assert example.answer in results[1], results[1]  # the second hop's document came back
        return f"<answer>{example.answer}</answer>"

    def generate(self, prompts, *, prefills=None, stop=None, **_):
        assert all(isinstance(p, RenderedPrompt) for p in prompts)
        prefills = prefills or [None] * len(prompts)
        return [self.turn(p, f) for p, f in zip(prompts, prefills, strict=True)]


def test_the_qa_example_rewards_an_agent_that_searches_twice(tiny_lm):
    sets = [  # a character a token: room for two calls and the answer
        f"problem.model={tiny_lm}", *TINY, "problem.batch_size=4",
        "problem.agent.max_tokens=400", "problem.agent.max_new_tokens=200",
    ]  # fmt: skip
    session = load_run(QA_EXAMPLE, sets)
    evaluator = session.problem.evaluator
    backend = evaluator.loop.backend = evaluator.backend = SearchingBackend(evaluator.task)
    rewards = evaluator.evaluate(session.problem.space, session.strategy.ask())
    assert rewards.tolist() == [1.0] * 8  # every question answered right, two searches each
    assert len(backend.queries) == 8 * 4 * 2
    for t in evaluator._step_trajectories:
        assert (t.calls, t.valid_calls, t.turns, t.stop) == (2, 2, 3, "answer")
        assert [m["name"] for m in t.messages if m["role"] == "tool"] == ["search", "search"]


# -- ESOpt co-evolving an agent's skill texts (docs/contexts.md, "Agents") -------------------------
def contexts_doc_config(tmp_path: Path) -> Path:
    """The YAML block of the Agents section of docs/contexts.md, written to a file."""
    text = (ROOT / "docs" / "contexts.md").read_text()
    section = text.split("\n## Agents\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    config = yaml.safe_load(block)
    assert config["strategy"] == "esopt" and config["problem"]["agent"]["tools"] == ["search"]
    path = tmp_path / "agent-qa-esopt.yaml"
    path.write_text(block)
    return path


def esopt_agent(tiny_lm: Path, tmp_path: Path, run: Path, steps: int, *sets: str):
    return optimize(
        contexts_doc_config(tmp_path), run, f"problem.model={tiny_lm}", *TINY,
        "options.population=4", "options.evolve_every=1", "problem.agent.max_tokens=40",
        "problem.agent.max_new_tokens=20", "problem.proposer_max_new_tokens=12",
        f"budget.max_steps={steps}", "checkpoint.every=1", *sets,
    )  # fmt: skip


def test_each_member_s_trajectories_read_its_skill_text_first(tiny_lm, tmp_path):
    run = tmp_path / "run"
    result = esopt_agent(tiny_lm, tmp_path, run, 1, "problem.context_proposer=none")
    assert result.exit_code == 0, result.output
    contexts = yaml.safe_load(contexts_doc_config(tmp_path).read_text())["options"]["contexts"]
    rows = records(run)
    assert [r["context"] for r in rows] == [0, 1, 0, 1]  # round-robin over the two skills
    for row in rows:
        skill = contexts[row["context"]]
        assert row["system"].startswith(skill) and "<tools>" in row["system"]
        assert row["messages"][0] == {"role": "system", "content": skill}  # one system message
        assert contexts[1 - row["context"]] not in row["system"]
    summary = json.loads((run / "summary.json").read_text())
    assert [c["text"] for c in summary["contexts"]] == contexts  # no proposer: kept as given


def test_the_model_rewrites_an_agent_s_skill_texts_and_the_next_step_uses_them(tiny_lm, tmp_path):
    run = tmp_path / "run"
    result = esopt_agent(tiny_lm, tmp_path, run, 2)
    assert result.exit_code == 0, result.output
    initial = yaml.safe_load(contexts_doc_config(tmp_path).read_text())["options"]["contexts"]
    summary = json.loads((run / "summary.json").read_text())
    assert [c["text"] for c in summary["contexts"]] != initial  # the worst one was replaced
    assert (run / "best_context.txt").read_text() == summary["best_context"] + "\n"
    after_first = json.loads((run / "checkpoints" / "step-00000001" / "state.json").read_text())
    evolved = after_first["strategy"]["extra"]["contexts"]
    assert evolved != initial
    step_one = [r for r in records(run) if r["step"] == 1]
    assert len(step_one) == 4
    for row in step_one:  # step 1 runs with the texts the proposer left after step 0
        assert row["system"].startswith(evolved[row["context"]])
    last = json.loads((latest_checkpoint(run / "checkpoints") / "state.json").read_text())
    assert last["strategy"]["extra"]["contexts"] == [c["text"] for c in summary["contexts"]]
