"""benchmarks/horizon.py without its runs (``--quick`` runs the rl suite on 3 horizons: too slow
for CI): each horizon's ES and GRPO configs pose the same, valid problem at that horizon, and
the table's success, gain and paired SE are computed from the rl suite's per-question results."""

from __future__ import annotations

import itertools
import math

import pytest

pytest.importorskip("textarena")

from benchmarks import horizon
from esbox.adapters.agents.config import agent_options
from esbox.adapters.tasks.loading import load_task


@pytest.mark.parametrize(
    ("family", "h"), [("chain", 1), ("chain", 4), ("sudoku", 2), ("sudoku", 8)]
)
def test_each_horizon_s_configs_pose_the_same_problem_at_that_horizon(family, h):
    es, grpo = horizon.configs(family, h, None)
    assert es["problem"] == grpo["problem"] and "grpo" in grpo and "options" in es
    task = load_task({**es["problem"]["task"], "train_size": 4, "heldout_size": 2})
    agent = agent_options(es["problem"]["agent"])
    assert agent.max_turns == h + 1
    example = task.train[0]
    if family == "chain":
        assert example.meta["horizon"] == h and len(example.meta["values"]) == h + 1
    else:
        game = task.environment_factory()
        game.reset(seed=example.meta["seed"])
        board = game._game.state.game_state["board"]
        assert sum(cell == 0 for row in board for cell in row) == h


def test_the_table_pairs_each_method_with_the_base_question_by_question():
    raw = {"chain-h2": {"base": {"greedy": [0, 1, 0, 0]}, "runs": [
        {"method": "copes", "seed": 0, "peak_rss_mib": 900.0},  # a tuning run: not tested
        {"method": "copes", "seed": 1, "peak_rss_mib": 500.0, "test": {"greedy": [1, 1, 0, 0]}},
        {"method": "copes", "seed": 2, "peak_rss_mib": 520.0, "test": {"greedy": [1, 1, 1, 0]}},
        {"method": "grpo", "seed": 1, "peak_rss_mib": 990.0, "test": {"greedy": [0, 0, 0, 0]}},
    ]}}  # fmt: skip
    rows = horizon.summarize(raw, [("chain", 2, "chain-h2")])
    assert rows[0] == ["chain", 2, "base", "0.250", "", ""]
    diffs = [1, 0, 0, 0, 1, 0, 1, 0]
    se = math.sqrt(sum((d - 3 / 8) ** 2 for d in diffs) / 7 / 8)
    assert rows[1] == ["chain", 2, "copes", "0.625", f"+0.375 ± {se:.3f}", "520"]
    assert rows[2][2:5] == ["grpo", "0.000", "-0.250 ± 0.250"]


def test_the_clock_and_each_side_s_sets_pass_to_the_rl_suite(tmp_path, monkeypatch):
    from benchmarks import rl

    seen = []
    monkeypatch.setattr(rl, "main", lambda argv: seen.append(argv) or 1)  # stops after the call
    argv = ["--chain", "8", "--sudoku", "", "--clock", "wall", "--es-set", "problem.backend=vllm",
            "--grpo-set", "grpo.use_vllm=true", "--csv", str(tmp_path)]  # fmt: skip
    assert horizon.main(argv) == 1
    (passed,) = seen
    flags = list(itertools.pairwise(passed))
    assert ("--clock", "wall") in flags and ("--tasks", "chain-h8") in flags
    assert ("--es-set", "problem.backend=vllm") in flags
    assert ("--grpo-set", "grpo.use_vllm=true") in flags
