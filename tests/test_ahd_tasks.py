"""The AHD tasks: seeded instances with disjoint splits, the reference scoring 0, a better
heuristic scoring above 0, failing code scoring 0 as a counted error, and bad options exiting 2.

Sandbox runs are few and small (a sandbox run a test, instances of a few dozen items or cities).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from cli_runs import invoke_cli  # tests/cli_runs.py
from click.testing import CliRunner

from esbox.adapters.agents.sandbox import Sandbox, SandboxLimits
from esbox.adapters.models.testing import save_tiny_lm
from esbox.adapters.problems.heuristics_log import HeuristicFigures, HeuristicLog
from esbox.adapters.problems.llm import attach_sandbox
from esbox.adapters.problems.scoring import score_model
from esbox.adapters.rl.session import problem_task
from esbox.adapters.tasks import ahd_runtime
from esbox.adapters.tasks.ahd import extract_code
from esbox.adapters.tasks.ahd_binpacking import REFERENCE as BEST_FIT
from esbox.adapters.tasks.ahd_binpacking import BinPackingTask
from esbox.adapters.tasks.ahd_tsp import REFERENCE as NEAREST
from esbox.adapters.tasks.ahd_tsp import TSPTask
from esbox.adapters.tasks.loading import load_task
from esbox.cli.main import cli
from esbox.errors import ConfigError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux's")

# FunSearch's heuristic for the OR-Library sets, in plain Python: 12 excess bins on the first
# default train example where best fit leaves 13.
BETTER_PACKING = """def priority(item, bins):
    scores = [1000 - b * (b - item) for b in bins]
    i = bins.index(min(bins))
    scores[i] = scores[i] * item - (bins[i] - item) ** 4
    return scores
"""

# Nearest neighbour improved by 2-opt: the whole tour is built on the first call.
TWO_OPT = """TOUR = []

def next_city(current, unvisited, distances):
    if len(unvisited) == len(distances) - 1:
        tour, left = [current], set(unvisited)
        while left:
            tour.append(min(left, key=lambda c: distances[tour[-1]][c]))
            left.remove(tour[-1])
        n, better = len(tour), True
        while better:
            better = False
            for i in range(1, n - 1):
                for j in range(i + 1, n):
                    a, b, c, d = tour[i - 1], tour[i], tour[j], tour[(j + 1) % n]
                    gain = distances[a][b] + distances[c][d] - distances[a][c] - distances[b][d]
                    if gain > 1e-12:
                        tour[i : j + 1] = tour[i : j + 1][::-1]
                        better = True
        TOUR[:] = tour[1:]
    return TOUR.pop(0)
"""


def fenced(code: str) -> str:
    return f"Here is my heuristic.\n```python\n{code}```\nIt should work."


def sandboxed(task):
    """``task`` with the sandbox its options ask for (the strongest mode here, as in a run)."""
    options = task.sandbox_options()
    task.sandbox = Sandbox(SandboxLimits(**options["limits"]), mode=options["mode"])
    return task


@pytest.fixture(scope="module")
def packing() -> BinPackingTask:
    return sandboxed(BinPackingTask(train_size=2, heldout_size=2, cpu_seconds=1))


@pytest.fixture(scope="module")
def tsp() -> TSPTask:
    return sandboxed(TSPTask(n_cities=20, instances=2, train_size=2, heldout_size=2, cpu_seconds=1))


def test_scoring_without_a_sandbox_refuses_rather_than_run_the_code_here():
    task = BinPackingTask(train_size=1, heldout_size=0)
    assert task.sandbox_options()["limits"]["output_bytes"] >= 16_384
    with pytest.raises(RuntimeError, match="only in a sandbox"):
        task.score(fenced(BEST_FIT), task.train[0])
    with pytest.raises(RuntimeError, match="only in a sandbox"):
        task.score("no code at all", task.train[0])
    attach_sandbox(task)
    assert isinstance(task.sandbox, Sandbox) and task.sandbox.limits.wall_seconds == 10


def test_the_reference_written_as_a_completion_scores_0_without_an_error(packing, tsp):
    for task, code in ((packing, BEST_FIT), (tsp, NEAREST)):
        example = task.train[0]
        outcome = task.outcome(fenced(code), example)
        assert outcome.error is None and outcome.reward == 0.0
        assert outcome.cost == outcome.reference == task.reference_cost(example) > 0
    assert packing.errors == tsp.errors == 0


def test_a_better_heuristic_scores_above_0(packing, tsp):
    outcome = packing.outcome(fenced(BETTER_PACKING), packing.train[0])
    assert outcome.error is None and outcome.reward == pytest.approx(1 / 13)
    outcome = tsp.outcome(fenced(TWO_OPT), tsp.train[0])
    assert outcome.error is None and 0.0 < outcome.reward < 1.0
    assert outcome.reward == pytest.approx((outcome.reference - outcome.cost) / outcome.reference)
    assert tsp.is_correct(fenced(TWO_OPT), tsp.train[0])


def test_valid_credit_ranks_valid_code_above_failing_code_and_by_its_cost():
    task = BinPackingTask(train_size=1, heldout_size=0, valid_credit=0.2)
    assert task.reward_of(13.0, 13.0) == pytest.approx(0.2)  # the reference
    assert task.reward_of(12.0, 13.0) == pytest.approx(0.2 + 0.8 / 13)  # better: above it
    assert task.reward_of(19.5, 13.0) == pytest.approx(0.1)  # 1.5x the reference's cost
    assert task.reward_of(30.0, 13.0) == 0.0  # twice the cost or more: a crash's reward
    rewards = [task.reward_of(c, 13.0) for c in (26.0, 20.0, 15.0, 13.0, 10.0, 0.0)]
    assert rewards == sorted(rewards) and rewards[-1] == 1.0
    default = BinPackingTask(train_size=1, heldout_size=0)
    assert default.reward_of(15.0, 13.0) == default.reward_of(13.0, 13.0) == 0.0


def test_with_valid_credit_a_worse_valid_heuristic_scores_between_a_crash_and_the_reference():
    task = sandboxed(BinPackingTask(train_size=1, heldout_size=0, cpu_seconds=1, valid_credit=0.1))
    example = task.train[0]
    first_fit = "def priority(item, bins):\n    return [-i for i in range(len(bins))]\n"
    reference, worse = (task.outcome(fenced(c), example) for c in (BEST_FIT, first_fit))
    crash = task.outcome(fenced(BROKEN_PACKING["error"]), example)
    assert reference.reward == pytest.approx(0.1) and crash.reward == 0.0
    assert worse.error is None and worse.cost > worse.reference
    assert 0.0 < worse.reward < reference.reward
    assert not task.is_correct(fenced(BEST_FIT), example)  # the reference does not beat itself
    assert task.is_correct(fenced(BETTER_PACKING), example)


FORGED = (
    "import sys\nsys.stdout.write('\\n@@ahd-result@@ ' + repr([[0] * {n}] * {k}))\nsys.exit(0)\n"
)
BROKEN_PACKING = {
    "error": "def priority(item, bins):\n    raise ValueError('no idea')\n",
    "timeout": "def priority(item, bins):\n    while True:\n        pass\n",
    "wrong type": "def priority(item, bins):\n    return 'best'\n",
    "short": "def priority(item, bins):\n    return [1.0]\n",
    "huge print": "def priority(item, bins):\n    print('x' * 10_000_000)\n    return bins\n",
    "invalid packing": f"{FORGED.format(n=100, k=4)}def priority(item, bins):\n    return bins\n",
    "no function": "def prio(item, bins):\n    return bins\n",
}
KINDS = {
    "error": "error", "timeout": "timeout", "wrong type": "error", "short": "error",
    "huge print": "output limit", "invalid packing": "invalid solution", "no function": "no code",
}  # fmt: skip


def children() -> list[int]:
    """Live processes whose parent is this one (the sandbox's bwrap or process group leader)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == os.getpid():
            found.append(int(pid))
    return found


def test_failing_code_scores_0_and_is_a_counted_error_and_the_run_goes_on(packing):
    before = packing.errors
    for case, code in BROKEN_PACKING.items():
        outcome = packing.outcome(fenced(code), packing.train[1])
        assert (outcome.reward, outcome.error) == (0.0, KINDS[case]), case
        assert children() == [], case  # the loop and the huge print leave no process behind
    assert packing.score("I cannot write code.", packing.train[1]) == 0.0
    assert packing.errors == before + len(BROKEN_PACKING) + 1
    assert packing.error_kinds["no code"] == 2 and packing.metrics()["ahd_errors_timeout"] == 1
    assert packing.outcome(fenced(BEST_FIT), packing.train[1]).error is None  # still scoring


def test_an_invalid_tour_is_a_counted_error(tsp):
    code = FORGED.format(n=20, k=2) + NEAREST
    assert tsp.outcome(fenced(code), tsp.train[1]).error == "invalid solution"
    assert tsp._cost(tsp.train[1].meta["instances"][0], [0, 1, 1, *range(3, 20)]) is None


def test_the_same_code_on_the_same_example_runs_once_but_counts_each_time(packing):
    code = fenced("def priority(item, bins):\n    return None\n")
    scored, errors = packing.scored, packing.errors
    first = packing.outcome(code, packing.heldout[0])
    assert packing.outcome(code, packing.heldout[0]) is first and first.error == "error"
    assert (packing.scored - scored, packing.errors - errors) == (2, 2)


def test_code_is_the_last_fenced_block_defining_the_function_else_the_text_from_its_def():
    text = "```python\nx = 1\n```\n```python\ndef f(a):\n    return 1\n```\n```py\ndef f(a):\n"
    assert extract_code(text, "f") == "def f(a):\n"
    assert extract_code("Sure.\ndef f(a):\n    return a", "f") == "def f(a):\n    return a"
    assert extract_code("def g(a): pass", "f") is None


def test_instances_are_seeded_and_held_out_never_overlaps_train():
    def instances(task, split):
        return [i for e in task.split(split) for i in e.meta["instances"]]

    for make in (BinPackingTask, lambda **k: TSPTask(n_cities=5, **k)):
        a, b, c = make(seed=3), make(seed=3), make(seed=4)
        assert instances(a, "train") == instances(b, "train") != instances(c, "train")
        assert instances(a, "heldout") == instances(b, "heldout")
        train = {repr(i) for i in instances(a, "train")}
        assert train.isdisjoint(repr(i) for i in instances(a, "heldout"))
        assert len(train) == 64 * 4
    items = [x for i in instances(BinPackingTask(n_items=50), "train") for x in i["items"]]
    assert min(items) >= 1 and max(items) <= 100 and 30 < sum(items) / len(items) < 50


def test_the_runtime_packs_with_best_fit_and_builds_nearest_neighbour_tours():
    assignment = ahd_runtime.pack_online([60, 50, 40, 30], 100, BinPackingTask.reference)
    assert assignment == [0, 1, 0, 1]
    distances = ahd_runtime.distance_matrix([[0, 0], [3, 0], [1, 0], [2, 0]])
    assert ahd_runtime.build_tour(distances, TSPTask.reference) == [0, 2, 3, 1]


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"kind": "ahd_binpacking", "n_items": 0}, "n_items"),
        ({"kind": "ahd_binpacking", "capacity": 0}, "capacity"),
        ({"kind": "ahd_binpacking", "scale": -1.0}, "scale"),
        ({"kind": "ahd_binpacking", "instances": 0}, "instances"),
        ({"kind": "ahd_binpacking", "cpu_seconds": 0}, "cpu_seconds"),
        ({"kind": "ahd_binpacking", "items": 10}, "items"),
        ({"kind": "ahd_tsp", "n_cities": 2}, "n_cities"),
        ({"kind": "ahd_tsp", "n_items": 10}, "n_items"),
        ({"kind": "ahd_tsp", "sandbox_mode": "none"}, "sandbox_mode"),
        ({"kind": "ahd_tsp", "sandbox": "bwrap"}, "sandbox"),
        ({"kind": "ahd_tsp", "valid_credit": 1.0}, "valid_credit"),
        ({"kind": "ahd_binpacking", "valid_credit": "some"}, "valid_credit"),
    ],
)
def test_bad_options_are_config_errors_naming_the_key(spec, key):
    with pytest.raises(ConfigError, match=key):
        load_task(spec)


def test_the_heuristics_scored_in_a_step_are_logged_once_each_with_a_count(packing, tmp_path):
    task = BinPackingTask(train_size=2, heldout_size=1, cpu_seconds=1, sandbox=packing.sandbox)
    log = HeuristicLog(task)
    log.start(tmp_path)
    for _ in range(3):  # three members that wrote the same reply
        task.reward(fenced(BETTER_PACKING), task.train[0])
    task.reward("no idea", task.train[1])
    log(SimpleNamespace(strategy=SimpleNamespace(step=1)), {"step": 0})
    log(SimpleNamespace(strategy=SimpleNamespace(step=2)), {"step": 1})  # a step with nothing
    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").open()]
    assert [(r["step"], r["index"], r["times"], r["error"]) for r in records] == [
        (0, 0, 3, None), (0, 1, 1, "no code")
    ]  # fmt: skip
    assert records[0]["code"] == BETTER_PACKING and records[0]["reward"] == pytest.approx(1 / 13)
    assert (records[0]["cost"], records[0]["reference"]) == (12.0, 13.0)


@pytest.mark.parametrize("cut", ["in the evaluation", "in the validation"])
def test_an_interrupted_step_logs_and_counts_the_same_after_a_resume(packing, tmp_path, cut):
    """The checkpoint keeps what the step's completed evaluation scored, and not a partial
    evaluation or validation, which the resume runs again (see Runner.step)."""
    runner = SimpleNamespace(strategy=SimpleNamespace(step=1))

    def built(directory):
        task = BinPackingTask(train_size=2, heldout_size=1, cpu_seconds=1, sandbox=packing.sandbox)
        callbacks = HeuristicFigures(task), HeuristicLog(task)
        callbacks[1].start(directory)
        return task, callbacks

    def evaluation(task, callbacks):
        task.reward(fenced(BETTER_PACKING), task.train[0])
        task.reward("no idea", task.train[1])
        for callback in callbacks:
            callback.on_step_evaluated(runner)

    def validation_and_callbacks(task, callbacks, directory):
        task.reward("still no idea", task.heldout[0])
        metrics = {"step": 0}
        for callback in callbacks:
            callback(runner, metrics)
        return metrics, (directory / "trajectories.jsonl").read_text()

    straight, interrupted = tmp_path / "straight", tmp_path / "cut"
    straight.mkdir(), interrupted.mkdir()
    task, callbacks = built(straight)
    evaluation(task, callbacks)
    expected = validation_and_callbacks(task, callbacks, straight)
    task, callbacks = built(interrupted)
    if cut == "in the evaluation":
        task.reward(fenced(BETTER_PACKING), task.train[0])  # then Ctrl-C: the state is saved
    else:
        evaluation(task, callbacks)
        task.reward("still no idea", task.heldout[0])  # the validation, then Ctrl-C
    states = json.loads(json.dumps([c.state_dict() for c in callbacks]))
    task, callbacks = built(interrupted)
    for callback, state in zip(callbacks, states, strict=True):
        callback.load_state_dict(state)
    if cut == "in the evaluation":
        evaluation(task, callbacks)  # the resume evaluates the step again
    assert validation_and_callbacks(task, callbacks, interrupted) == expected
    assert expected[0]["ahd_scored"] == 3 and expected[0]["ahd_errors_no_code"] == 2


def test_esbox_trajectories_prints_the_heuristics_and_refuses_a_member(packing, tmp_path):
    task = BinPackingTask(train_size=1, heldout_size=1, cpu_seconds=1, sandbox=packing.sandbox)
    log = HeuristicLog(task)
    log.start(tmp_path)
    task.reward(fenced(BETTER_PACKING), task.train[0])
    log(SimpleNamespace(strategy=SimpleNamespace(step=1)), {"step": 0})
    shown = CliRunner().invoke(cli, ["trajectories", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "train example 0: reward 0.0769" in shown.output and "cost 12" in shown.output
    assert "def priority(item, bins):" in shown.output
    refused = CliRunner().invoke(cli, ["trajectories", str(tmp_path), "--member", "0"])
    assert refused.exit_code == 2 and "drop --member" in refused.output


def test_test_time_mode_scores_validation_on_the_instance_set_it_optimizes(packing):
    task = BinPackingTask(train_size=3, heldout_size=5, test_time=True, sandbox=packing.sandbox)
    assert task.heldout == task.train and len(task.heldout) == 3
    generalising = BinPackingTask(train_size=3, heldout_size=5)
    assert [e.meta["instances"] for e in generalising.train] == [
        e.meta["instances"] for e in task.train
    ] and len(generalising.heldout) == 5
    with pytest.raises(ConfigError, match=r"problem\.task\.test_time"):
        BinPackingTask(test_time="yes")


def test_esbox_heuristics_rescores_the_best_logged_codes_on_the_held_out_split(packing, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    spec = {"kind": "ahd_binpacking", "train_size": 2, "heldout_size": 2, "cpu_seconds": 1}
    (run / "config.yaml").write_text(yaml.safe_dump({"problem": {"kind": "llm", "task": spec}}))
    task = load_task(spec)
    task.sandbox = packing.sandbox
    log = HeuristicLog(task)
    log.start(run)
    task.reward(fenced(BEST_FIT), task.train[0])  # logged 0: the reference itself
    task.reward(fenced(BETTER_PACKING), task.train[1])
    task.reward("no idea", task.train[0])
    log(SimpleNamespace(strategy=SimpleNamespace(step=1)), {"step": 0})
    saved = tmp_path / "best.py"
    shown = CliRunner().invoke(cli, ["heuristics", str(run), "--save", str(saved)])
    assert shown.exit_code == 0, shown.output
    rows = [line for line in shown.output.splitlines() if line.startswith(("| 1 ", "| 2 "))]
    assert len(rows) == 2 and " 0.0000 | 0/2 |" in rows[1]  # the reference ties on held-out
    assert float(rows[0].split("|")[2]) > 0 and saved.read_text() == BETTER_PACKING
    held = [task.score_code(BETTER_PACKING, e).reward for e in task.heldout]
    assert float(rows[0].split("|")[2]) == pytest.approx(sum(held) / 2, abs=1e-4)
    refused = CliRunner().invoke(cli, ["heuristics", str(tmp_path)])
    assert refused.exit_code == 2 and "not an AHD run" in refused.output


class Replies:
    """A backend that answers every prompt with ``reply``."""

    def __init__(self, reply: str) -> None:
        self.reply = reply

    def generate(self, prompts, **_):
        return [self.reply] * len(prompts)


def test_esbox_evaluate_and_grpo_score_an_ahd_task_in_the_sandbox():
    task = BinPackingTask(train_size=1, heldout_size=1)
    score = score_model(task, task.heldout, Replies(fenced(BETTER_PACKING)))
    assert isinstance(task.sandbox, Sandbox) and task.errors == 0
    assert score.figures["mean_reward"] > 0 and score.correct == [True]
    assert isinstance(problem_task({"task": {"kind": "ahd_tsp"}}).sandbox, Sandbox)


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("models") / "tiny", max_position_embeddings=4096)


def test_the_example_runs_and_logs_the_code_scored_and_the_errors(tiny_lm, tmp_path):
    example = Path(__file__).parent.parent / "examples" / "ahd-binpacking.yaml"
    sets = [
        f"problem.model={tiny_lm}", "problem.batch_size=2", "problem.max_new_tokens=4",
        "problem.validation_every=1", "problem.validation_limit=1", "problem.task.train_size=2",
        "problem.task.heldout_size=1", "problem.task.n_items=10", "options.population=2",
        "budget.max_steps=1", "checkpoint.every=0",
    ]  # fmt: skip
    args = ["optimize", "-q", "-c", str(example), "--out", str(tmp_path / "run")]
    result = invoke_cli(args, sets)
    assert result.exit_code == 0, result.output
    (metrics,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    # the step's 2 members x 2 examples, and one held-out example before and after the step
    assert metrics["ahd_scored"] == 2 * 2 + 1 + 1
    assert metrics["ahd_errors"] == metrics["ahd_errors_no_code"] == 6  # a random model's text
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").open()]
    assert sum(r["times"] for r in records) == 6 and {r["error"] for r in records} == {"no code"}
    assert {(r["split"], r["step"]) for r in records} >= {("train", 0), ("heldout", 0)}
    assert set(records[0]) >= {"code", "reward", "cost", "reference", "error", "index"}


def test_a_bad_instance_setting_exits_2_naming_the_key(tiny_lm, tmp_path):
    model = tiny_lm
    args = ["optimize", "-q", "--dry-run", "--strategy", "openai_es", "--out", str(tmp_path / "r")]
    sets = ("problem.kind=llm", f"problem.model={model}",
            "problem.task={kind: ahd_tsp, n_cities: 2}")  # fmt: skip
    result = invoke_cli(args, sets)
    assert result.exit_code == 2 and "problem.task.n_cities" in result.output
