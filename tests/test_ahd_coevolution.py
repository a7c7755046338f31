"""Co-evolution on AHD (issue 30): the proposer sees the step's best code with its rewards,
validation can read the best context, ``esbox evaluate`` scores a contexts run with it, bad
keys exit 2, and ``python -m benchmarks ahd --quick`` runs its protocol end to end.

Runs are a tiny random model for a step or two, whose replies define no function (``no code``).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from esbox.adapters.models.testing import save_tiny_lm
from esbox.adapters.tasks import proposers, rollouts
from esbox.adapters.tasks.ahd_binpacking import REFERENCE as BEST_FIT
from esbox.adapters.tasks.ahd_binpacking import BinPackingTask
from esbox.adapters.tasks.proposers import ModelContextProposer
from esbox.adapters.tasks.rollouts import HeldoutValidation
from esbox.cli.main import cli

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux's")

EXAMPLE = Path(__file__).parent.parent / "examples" / "ahd-binpacking.yaml"
SKILL = "Write one short Python function with the exact signature asked for."
BETTER = """def priority(item, bins):
    scores = [1000 - b * (b - item) for b in bins]
    i = bins.index(min(bins))
    scores[i] = scores[i] * item - (bins[i] - item) ** 4
    return scores
"""


def fenced(code: str) -> str:
    return f"```python\n{code}```"


class Recorder:
    """A backend that records its prompts and answers each with ``reply``."""

    def __init__(self, reply: str = "Write better code.") -> None:
        self.reply, self.prompts = reply, []

    def generate(self, prompts, **_):
        self.prompts += prompts
        return [self.reply] * len(prompts)


@pytest.fixture(scope="module")
def packing() -> BinPackingTask:
    from esbox.adapters.problems.llm import attach_sandbox

    task = BinPackingTask(train_size=2, heldout_size=1, cpu_seconds=1)
    attach_sandbox(task)
    return task


def test_the_meta_prompt_shows_the_best_codes_with_their_rewards_and_errors(packing):
    packing.attempts = []
    for _ in range(3):  # three members wrote it: it counts once
        packing.reward(fenced(BETTER), packing.train[0])
    packing.reward(fenced(BEST_FIT), packing.train[0])
    packing.reward("no idea", packing.train[1])
    packing.reward(fenced(BETTER.replace("1000", "999")), packing.heldout[0])  # never shown
    backend = Recorder()
    proposer = ModelContextProposer(backend, evidence=lambda: packing.evidence(2))
    assert proposer("a", ["a", "b"], [0.25, math.nan]) == "Write better code."
    request = backend.prompts[0][1]["content"]
    assert request.index("scored 0.250") < request.index(BETTER.rstrip())
    assert "Code 1: mean reward 0.077 on 1 examples, beats the reference on 1" in request
    assert "Code 2: mean reward 0.000 on 1 examples" in request
    assert BEST_FIT.rstrip() in request and "999" not in request
    assert "on 2 train examples: 2 distinct codes" in request and "example: no code 1." in request
    assert request.index("Code 2") < request.rindex("Reply with the rewritten instructions only.")
    before = packing.evidence(2)
    packing.reward(fenced(BETTER), packing.train[0])  # a repeat (as after a resume) changes nothing
    assert packing.evidence(2) == before
    assert "Code 2" not in packing.evidence(1)
    packing.attempts = []
    assert packing.evidence(2) == "" and "Code" not in proposers.meta_prompt("a", ["a"], [0.0])


def test_validation_with_the_best_context_reads_it_before_every_prompt(packing):
    backend = Recorder(fenced(BETTER))
    runner = SimpleNamespace(strategy=SimpleNamespace(best_context="THE SKILL", step=1))
    HeldoutValidation(packing, backend, every=1, with_context=True).on_start(runner)
    metrics = {}
    HeldoutValidation(packing, backend, every=1)(runner, metrics)
    with_skill, without = backend.prompts
    assert with_skill[0] == {"role": "system", "content": "THE SKILL"}
    assert with_skill[1:] == without == packing.heldout[0].prompt
    assert metrics["val_mean_reward"] > 0


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=4096)


def optimize(tiny_lm: Path, out: Path, steps: int, *extra: str, flags: tuple = ()):
    sets = [
        f"problem.model={tiny_lm}", "problem.batch_size=2", "problem.max_new_tokens=4",
        "problem.validation_every=1", "problem.validation_limit=1", "problem.task.train_size=2",
        "problem.task.heldout_size=1", "problem.task.n_items=10", "options.population=4",
        f"options.contexts=[{SKILL}, {SKILL}]", "problem.context_proposer=model",
        "problem.proposer_max_new_tokens=4", "problem.proposer_evidence=2",
        "problem.validation_context=best", f"budget.max_steps={steps}", "checkpoint.every=1",
        *extra,
    ]  # fmt: skip
    args = ["optimize", "-q", *flags, "-c", str(EXAMPLE), "--out", str(out)]
    for item in sets:
        args += ["--set", item]
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.fixture
def requests(monkeypatch):
    """The proposer's requests and the contexts validation read, as a run makes them."""
    seen = {"proposals": [], "validations": []}
    prompt, evaluate = ModelContextProposer.prompt, rollouts.evaluate

    def recorded_prompt(self, *args):
        sent = prompt(self, *args)
        seen["proposals"].append(sent if isinstance(sent, str) else sent[-1]["content"])
        return sent

    def recorded_evaluate(*args, context=None, **kwargs):
        seen["validations"].append(context)
        return evaluate(*args, context=context, **kwargs)

    monkeypatch.setattr(ModelContextProposer, "prompt", recorded_prompt)
    monkeypatch.setattr(rollouts, "evaluate", recorded_evaluate)
    return seen


def test_a_contexts_run_shows_the_proposer_its_code_and_validates_with_its_best_context(
    tiny_lm, tmp_path, requests
):
    run = tmp_path / "run"
    result = optimize(tiny_lm, run, 2)
    assert result.exit_code == 0, result.output
    summary = json.loads((run / "summary.json").read_text())
    assert len(requests["proposals"]) == 2  # evolve_every 1: one proposal a step
    for request in requests["proposals"]:  # 4 members x 2 train examples, none wrote code
        assert "on 2 train examples: 0 distinct codes" in request and "no code 2." in request
        assert "No reply defined `priority`." in request
    # before the first step (the first context), then after each step: the best one
    assert requests["validations"][0] == SKILL and None not in requests["validations"]
    assert requests["validations"][-1] == summary["best_context"]
    shown = CliRunner().invoke(cli, ["evaluate", str(run), "--limit", "1"])
    assert shown.exit_code == 0, shown.output
    assert "reads its best context" in shown.output


def test_a_resumed_contexts_run_proposes_what_the_straight_run_did(tiny_lm, tmp_path, requests):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert optimize(tiny_lm, straight, 2).exit_code == 0
    first = list(requests["proposals"])
    assert optimize(tiny_lm, split, 1).exit_code == 0
    resumed = CliRunner().invoke(cli, ["resume", "-q", str(split), "--set", "budget.max_steps=2"])
    assert resumed.exit_code == 0, resumed.output
    assert requests["proposals"][2:] == first
    a, b = (json.loads((r / "summary.json").read_text()) for r in (straight, split))
    assert a["contexts"] == b["contexts"]
    rows = [(r / "metrics.jsonl").read_text() for r in (straight, split)]
    assert [json.loads(x)["val_mean_reward"] for x in rows[0].splitlines()] == [
        json.loads(x)["val_mean_reward"] for x in rows[1].splitlines()
    ]


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["problem.context_proposer=none"], "problem.proposer_evidence"),
        (["problem.task={kind: arithmetic}"], "problem.proposer_evidence"),
        (["problem.proposer_evidence=-1"], "key 'proposer_evidence' must be >= 0"),
        (
            ["options.contexts=[]", "problem.context_proposer=none", "problem.proposer_evidence=0"],
            "problem.validation_context",
        ),
        (["problem.validation_context=always"], "'validation_context'"),
    ],
)
def test_a_bad_co_evolution_key_exits_2_naming_it(tiny_lm, tmp_path, sets, key):
    result = optimize(tiny_lm, tmp_path / "run", 1, *sets, flags=("--dry-run",))
    assert result.exit_code == 2 and key in result.output, result.output


def test_the_benchmark_builds_each_arm_from_the_example_and_a_tsp_setting_is_valid(tmp_path):
    from benchmarks import ahd, measure

    args = ahd.parser().parse_args(["--csv", str(tmp_path)])
    assert len(ahd.settings(args)) == 8  # 2 tasks x 2 sizes x 2 seeds
    tsp = ahd.Setting("ahd_tsp", 20, 1)
    values = {arm: ahd.run_values(tsp, arm, args) for arm in ahd.ARMS}
    task = values["both"]["problem.task"]
    assert (task["kind"], task["n_cities"], task["seed"], task["heldout_size"]) == (
        "ahd_tsp", 20, 1, 16
    ) and "n_items" not in task  # fmt: skip
    assert values["contexts"]["options.learning_rate"] == 0.0
    assert "options.learning_rate" not in values["both"] and values["both"]["seed"] == 1
    assert values["parameters"]["options.contexts"] == [ahd.SKILL]
    assert values["both"]["problem.proposer_evidence"] == 2
    for arm, chosen in values.items():  # every arm's config passes esbox's checks
        flags = measure.set_flags(chosen)
        out = ["--out", str(tmp_path / arm)]
        result = CliRunner().invoke(
            cli, ["optimize", "--dry-run", "-c", str(EXAMPLE), *out, *flags]
        )
        assert result.exit_code == 0, result.output


def test_the_benchmark_s_clock_and_sets_reach_every_arm(tmp_path):
    from benchmarks import ahd

    argv = ["--clock", "wall", "--cpu-minutes", "2", "--set", "problem.backend=vllm",
            "--set", "problem.max_new_tokens=512", "--csv", str(tmp_path)]  # fmt: skip
    args = ahd.parser().parse_args(argv)
    for arm in ahd.ARMS:
        values = ahd.run_values(ahd.Setting("ahd_binpacking", 50, 0), arm, args)
        assert values["budget.max_seconds"] == 120.0 and "budget.max_cpu_seconds" not in values
        assert values["problem.backend"] == "vllm" and values["problem.max_new_tokens"] == 512
    bad = ahd.parser().parse_args(["--set", "oops", "--csv", str(tmp_path)])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        ahd.run_values(ahd.Setting("ahd_tsp", 20, 0), "both", bad)


def test_the_benchmark_quick_runs_its_protocol_end_to_end(tmp_path, capsys):
    from benchmarks import ahd

    assert ahd.main(["--quick", "--jobs", "2", "--csv", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "| parameters |" in shown and "| contexts |" in shown and "| both |" in shown
    assert "both improves its matched baseline (parameters only) in 0 of 1 settings" in shown
    assert "not a result" in shown
    rows = (tmp_path / "ahd" / "ahd.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 and rows[0].startswith("task,size,seed,arm,held-out reward")
    runs = tmp_path / "ahd-quick" / "ahd" / "binpacking-10-seed0"
    assert (runs / "parameters" / "best_context.txt").read_text().strip() == ahd.SKILL


def test_the_contexts_arm_never_moves_the_weights(tiny_lm, tmp_path, monkeypatch):
    # a reward that tells replies apart (the tiny model writes no code), so that "both" moves
    monkeypatch.setattr(BinPackingTask, "reward", lambda self, c, e: sum(map(ord, c)) % 11)
    start = load_file(str(tiny_lm / "model.safetensors"))
    for arm, rate in (("contexts", "0.0"), ("both", "0.01")):
        result = optimize(tiny_lm, tmp_path / arm, 2, f"options.learning_rate={rate}")
        assert result.exit_code == 0, result.output
        trained = load_file(str(tmp_path / arm / "model" / "model.safetensors"))
        assert all(torch.equal(start[k], trained[k]) for k in start) == (arm == "contexts")
