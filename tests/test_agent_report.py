"""``esbox report`` on agent runs: the tool-use figure and table columns, from metrics.jsonl files
written here the way an agent run writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from esbox.cli.main import cli
from esbox.cli.report import AGENT_COLUMNS, load_run, table, validation_points


def write_run(directory: Path, steps: int, agent: bool) -> Path:
    """A finished LLM run of ``steps`` steps, validated every 2; with ``agent``, tool use too."""
    directory.mkdir(parents=True)
    rows = []
    for step in range(steps):
        row = {"step": step, "evaluations": 8 * (step + 1), "reward_mean": 0.1 * step,
               "reward_max": 0.2 * step, "best_reward": 0.2 * step, "best_value": None,
               "wall_seconds": 2.0 * (step + 1)}  # fmt: skip
        if agent:
            row.update(agent_tool_call_rate=0.25 * step, agent_valid_call_rate=0.5 + 0.1 * step,
                       agent_tool_errors=float(step), agent_turns=1.0 + 0.3 * step,
                       agent_trajectory_tokens=40.0 + 5 * step, agent_answer_rate=0.9)  # fmt: skip
        if (step + 1) % 2 == 0:
            row.update(val_step=step + 1, val_accuracy=0.1 * step, val_n=4.0)
            if agent:
                row.update(val_tool_call_rate=0.5, val_valid_call_rate=0.75 + 0.05 * step,
                           val_turns=2.0, val_trajectory_tokens=50.0, val_answer_rate=1.0,
                           val_tool_errors=1.0)  # fmt: skip
        rows.append(row)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    baseline = {"val_step": 0, "val_accuracy": 0.0}
    if agent:
        baseline.update(val_tool_call_rate=0.0, val_valid_call_rate=0.0, val_turns=1.0)
    summary = {"status": "finished", "stop_reason": "max_steps", "strategy": "openai_es",
               "problem": "llm(tiny) on tool_math", "baseline": baseline}  # fmt: skip
    (directory / "summary.json").write_text(json.dumps(summary))
    return directory


@pytest.fixture
def runs(tmp_path) -> tuple[Path, Path]:
    return write_run(tmp_path / "agent", 4, agent=True), write_run(tmp_path / "plain", 4, False)


def test_report_plots_tool_use_and_adds_its_columns(runs, tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["report", *map(str, runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "agent.png").stat().st_size > 20_000  # six panels
    assert "![agent](agent.png)" in (out / "report.md").read_text()
    header, _, agent_row, plain_row = result.output.splitlines()[:4]
    assert all(column in header for column in AGENT_COLUMNS)
    cells = [c.strip() for c in agent_row.strip("|").split("|")]
    named = dict(zip([c.strip() for c in header.strip("|").split("|")], cells, strict=True))
    rates = (named["tool-call rate"], named["valid-call rate"], named["turns"])
    assert rates == ("0.75", "0.8", "1.9")  # the last step's rollouts
    assert named["trajectory tokens"] == "55" and named["tool errors"] == "3"
    assert named["held-out tool-call rate"] == "0.000 → 0.500"  # baseline → last check
    assert named["held-out valid-call rate"] == "0.000 → 0.900"
    assert plain_row.count("—") >= len(AGENT_COLUMNS)  # a run without tools has none


def test_runs_without_tools_keep_the_plain_report(runs, tmp_path):
    out = tmp_path / "plain-report"
    result = CliRunner().invoke(cli, ["report", str(runs[1]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not (out / "agent.png").exists() and (out / "validation.png").exists()
    assert "tool-call rate" not in result.output


def test_held_out_tool_figures_start_at_the_baseline(runs):
    run = load_run(runs[0])
    assert validation_points(run, "valid_call_rate") == [(0, 0, 0.0), (2, 16, 0.8), (4, 32, 0.9)]
    assert validation_points(run) == [(0, 0, 0.0), (2, 16, 0.1), (4, 32, pytest.approx(0.3))]
    assert "0.000 → 0.300" in table([run])
