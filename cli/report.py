"""``esbox report``: PNG plots of one or more runs overlaid, and a table of final figures."""

from __future__ import annotations

import itertools
import json
import math
import textwrap
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from esbox.cli.errors import CLIError
from esbox.cli.run import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE
from esbox.runconfig import load_yaml
from esbox.tracking import read_metrics

# x-axes of the right-hand panels (the left one is always the step); GRPO runs have no
# evaluations, ES runs without resource metrics no samples or CPU seconds
X_AXES = {
    "evaluations": "evaluations",
    "samples": "samples generated",
    "wall_seconds": "wall seconds",
    "cpu_seconds": "CPU seconds",
}


@dataclass
class RunData:
    """What a run directory recorded."""

    directory: Path
    label: str
    metrics: list[dict[str, Any]]
    summary: dict[str, Any]
    config: dict[str, Any]

    def best_key(self) -> str:
        """``best_value`` (objective units) when every step has it, else ``best_reward``."""
        ok = all(row.get("best_value") is not None for row in self.metrics)
        return "best_value" if ok else "best_reward"

    def strategy(self) -> str:
        """The strategy's name, from summary.json or else config.yaml."""
        return self.summary.get("strategy") or self.config.get("strategy", "—")

    def problem(self) -> str:
        """The problem's label (``rastrigin(d=100)``), or its config name or kind when the run
        wrote no summary."""
        problem = self.config.get("problem") or {}
        return self.summary.get("problem") or problem.get("name") or problem.get("kind", "—")


def load_run(directory: Path) -> RunData:
    """Read metrics.jsonl (required), summary.json and config.yaml (optional) of a run."""
    if not directory.is_dir():
        raise CLIError(f"run directory {directory} does not exist")
    path = directory / METRICS_FILE
    if not path.is_file():
        raise CLIError(f"{directory} has no {METRICS_FILE}: is it an esbox run directory?")
    try:
        metrics = read_metrics(path)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if not metrics:
        raise CLIError(f"{path} is empty: the run has not finished a step yet")
    summary: dict[str, Any] = {}
    if (directory / SUMMARY_FILE).is_file():
        summary = json.loads((directory / SUMMARY_FILE).read_text())
    config: dict[str, Any] = {}
    if (directory / CONFIG_FILE).is_file():
        try:
            config = load_yaml(directory / CONFIG_FILE)
        except ValueError:
            config = {}
    return RunData(directory, directory.name, metrics, summary, config)


def _values(run: RunData, key: str) -> list[float]:
    return [math.nan if row.get(key) is None else float(row[key]) for row in run.metrics]


def plot_title(runs: list[RunData]) -> str:
    """Names what a figure shows: the problem, each run's strategy and its run directory."""
    problems = list(dict.fromkeys(run.problem() for run in runs))
    if len(problems) == 1:
        return f"{problems[0]}: " + ", ".join(f"{run.strategy()} ({run.label})" for run in runs)
    return "; ".join(f"{run.strategy()} on {run.problem()} ({run.label})" for run in runs)


def _new_figure(
    runs: list[RunData], size: tuple[float, float], rows: int, cols: int, **kw: Any
) -> tuple[Any, Any]:
    """A headless figure titled with ``runs`` (wrapped at spaces only), and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    title = textwrap.fill(plot_title(runs), 120, break_on_hyphens=False, break_long_words=False)
    fig.suptitle(title, fontsize="medium")
    return fig, fig.subplots(rows, cols, **kw)


def _figure(
    runs: list[RunData],
    series: list[tuple[str, str, str]],
    ylabel: str,
    path: Path,
    *,
    log_y: bool = False,
    x_axis: str = "evaluations",
) -> None:
    """Two panels (vs steps, vs ``x_axis``); ``series`` are (key, line style, legend suffix)."""
    fig, axes = _new_figure(runs, (11, 4.2), 1, 2, sharey=True)
    panels = (("step", "step"), (x_axis, X_AXES[x_axis]))
    for ax, (xkey, xlabel) in zip(axes, panels, strict=True):
        for index, run in enumerate(runs):
            x = _values(run, xkey)
            for key, style, suffix in series:
                y = _values(run, run.best_key() if key == "best" else key)
                ax.plot(x, y, style, color=f"C{index % 10}", label=f"{run.label}{suffix}")
            for at in restart_points(run, xkey):  # a restart: a dotted line where it begins
                ax.axvline(at, color=f"C{index % 10}", linestyle=":", alpha=0.6)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if log_y:
            ax.set_yscale("log")
    axes[0].set_ylabel(ylabel)
    axes[1].legend(fontsize="small", loc="best")
    fig.savefig(path, dpi=110)


def restart_points(run: RunData, key: str = "step") -> list[float]:
    """``key`` of each step that began a restart (metrics' ``restart`` column goes up)."""
    rows = run.metrics
    return [
        float(row[key])
        for before, row in itertools.pairwise(rows)
        if row.get("restart", 0) != before.get("restart", 0) and row.get(key) is not None
    ]


def validation_points(
    run: RunData, key: str = "accuracy", x_axis: str = "evaluations"
) -> list[tuple[int, float, float]]:
    """(updates applied, the row's ``x_axis`` value, held-out ``val_<key>``): the baseline (at
    0), then every validation."""
    name = f"val_{key}"
    baseline = run.summary.get("baseline") or {}
    points = [(0, 0, float(baseline[name]))] if baseline.get(name) is not None else []
    for row in run.metrics:
        if row.get(name) is not None:
            step = int(row.get("val_step", int(row["step"]) + 1))
            x = math.nan if row.get(x_axis) is None else float(row[x_axis])
            points.append((step, x, float(row[name])))
    return points


def _validation_figure(runs: list[RunData], path: Path, x_axis: str) -> None:
    """Held-out accuracy against updates and ``x_axis``, one marked line per run."""
    fig, axes = _new_figure(runs, (11, 4.2), 1, 2, sharey=True)
    for ax, column, xlabel in zip(axes, (0, 1), ("updates", X_AXES[x_axis]), strict=True):
        for index, run in enumerate(runs):
            points = validation_points(run, x_axis=x_axis)
            ax.plot(
                [p[column] for p in points],
                [p[2] for p in points],
                "o-",
                color=f"C{index % 10}",
                label=run.label,
            )
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out accuracy")
    axes[1].legend(fontsize="small", loc="best")
    fig.savefig(path, dpi=110)


# agent runs (problem.agent): the step's agent_<key> and, where held out too, val_<key>
AGENT_PANELS = (
    ("tool_call_rate", "tool-call rate (trajectories with a call)", True),
    ("valid_call_rate", "valid-call rate (of all calls)", True),
    ("answer_rate", "answer rate (ended with an answer)", True),
    ("turns", "turns per trajectory", True),
    ("trajectory_tokens", "tokens per trajectory", True),
    ("tool_errors", "tool errors in the step", False),
)


def is_agent_run(run: RunData) -> bool:
    """Whether the run logged tool-use metrics (``agent_*``: a run with ``problem.agent``)."""
    return any(row.get("agent_tool_call_rate") is not None for row in run.metrics)


def _agent_figure(runs: list[RunData], path: Path) -> None:
    """Tool use over the steps, one panel per figure: each run's training rollouts (solid) and
    held-out checks (dashed, marked, from the baseline before the first update)."""
    fig, axes = _new_figure([run for run in runs if is_agent_run(run)], (13, 7), 2, 3, sharex=True)
    axes = axes.ravel()
    for ax, (key, ylabel, held_out) in zip(axes, AGENT_PANELS, strict=True):
        for index, run in enumerate(runs):
            if not is_agent_run(run):
                continue
            colour = f"C{index % 10}"  # the run's colour in the other figures
            ax.plot(_values(run, "step"), _values(run, f"agent_{key}"), "-", color=colour,
                    label=f"{run.label} rollouts")  # fmt: skip
            points = validation_points(run, key) if held_out else []
            if points:
                ax.plot([p[0] for p in points], [p[2] for p in points], "o--", color=colour,
                        label=f"{run.label} held-out")  # fmt: skip
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in axes[3:]:
        ax.set_xlabel("step (updates applied)")
    axes[0].legend(fontsize="small", loc="best")
    fig.savefig(path, dpi=110)


def _wide_positive(runs: list[RunData]) -> bool:
    """Whether best-so-far values are all positive and span enough for a log axis."""
    values = [v for run in runs for v in _values(run, run.best_key()) if math.isfinite(v)]
    return bool(values) and min(values) > 0 and max(values) / min(values) > 50


def plot_runs(runs: list[RunData], out: Path, x_axis: str = "evaluations") -> list[Path]:
    """Write reward.png (mean and max reward), best.png (best so far), for runs with a held-out
    validation (LLM runs) validation.png and for agent runs agent.png, each against the step
    and ``x_axis``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    reward, best = out / "reward.png", out / "best.png"
    _figure(
        runs,
        [("reward_mean", "-", " mean"), ("reward_max", "--", " max")],
        "reward (higher is better)",
        reward,
        x_axis=x_axis,
    )
    keys = {run.best_key() for run in runs}
    ylabel = "best value so far" if keys == {"best_value"} else "best so far"
    _figure(runs, [("best", "-", "")], ylabel, best, log_y=_wide_positive(runs), x_axis=x_axis)
    images = [reward, best]
    if any(validation_points(run) for run in runs):
        images.append(out / "validation.png")
        _validation_figure(runs, images[-1], x_axis)
    if any(is_agent_run(run) for run in runs):
        images.append(out / "agent.png")
        _agent_figure(runs, images[-1])
    return images


def _fmt(value: Any, digits: int = 6) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else str(value)
    return str(value)


def table(runs: list[RunData]) -> str:
    """A markdown table of each run's final figures."""
    head = (
        "run",
        "strategy",
        "problem",
        "steps",
        "evaluations",
        "best",
        "last reward mean",
        "wall s",
        "held-out accuracy",
        "stop",
    )
    agents = any(is_agent_run(run) for run in runs)
    restarts = any("restart" in row for run in runs for row in run.metrics[-1:])
    if restarts:
        head += ("restarts",)
    if agents:
        head += AGENT_COLUMNS
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        last, s = run.metrics[-1], run.summary
        cells = (
            run.label,
            run.strategy(),
            run.problem(),
            int(last["step"]) + 1,
            last.get("evaluations"),
            last.get(run.best_key()),
            last.get("reward_mean"),
            _fmt(last.get("wall_seconds"), 3),
            _change(validation_points(run)),
            s.get("stop_reason", "running or killed"),
        )
        if restarts:
            cells += (last.get("restart", 0),)
        if agents:
            cells += _agent_cells(run)
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    return "\n".join(lines)


AGENT_COLUMNS = (
    "tool-call rate",
    "valid-call rate",
    "turns",
    "trajectory tokens",
    "tool errors",
    "held-out tool-call rate",
    "held-out valid-call rate",
)


def _agent_cells(run: RunData) -> tuple[Any, ...]:
    """The last step's tool-use figures, then the held-out rates from baseline to last check."""
    last = next((r for r in reversed(run.metrics) if r.get("agent_turns") is not None), {})
    rollouts = tuple(
        _fmt(last.get(f"agent_{key}"), 3)
        for key in ("tool_call_rate", "valid_call_rate", "turns", "trajectory_tokens")
    )
    held_out = (_change(validation_points(run, k)) for k in ("tool_call_rate", "valid_call_rate"))
    return (*rollouts, _fmt(last.get("agent_tool_errors")), *held_out)


def _change(points: list[tuple[int, int, float]]) -> str:
    if not points:
        return "—"
    return f"{points[0][2]:.3f} → {points[-1][2]:.3f}" if len(points) > 1 else f"{points[0][2]:.3f}"


def _labels(runs: list[RunData]) -> None:
    names = [run.label for run in runs]
    if len(set(names)) < len(names):
        for run in runs:
            run.label = str(run.directory)


@click.command(short_help="Plot and tabulate one or more runs.")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    help="Output folder (default: RUN_DIR/report for one run, reports/compare-<time> for several).",
)
@click.option(
    "--x-axis",
    type=click.Choice(list(X_AXES)),
    default="evaluations",
    show_default=True,
    help="What the right-hand panels plot against (ES and GRPO runs overlay on samples, wall or "
    "CPU seconds).",
)
def report(run_dirs: tuple[Path, ...], out: Path | None, x_axis: str) -> None:
    """Plot reward and best-so-far of RUN_DIRs (overlaid) and tabulate their final figures.

    LLM runs add held-out accuracy (validation.png); agent runs (problem.agent) add tool use
    (agent.png: tool-call, valid-call and answer rates, turns, tokens, tool errors) and its
    columns in the table.
    """
    runs = [load_run(d) for d in run_dirs]
    _labels(runs)
    if out is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        out = run_dirs[0] / "report" if len(runs) == 1 else Path("reports") / f"compare-{stamp}"
    images = plot_runs(runs, out, x_axis)
    text = table(runs)
    links = "\n".join(f"![{p.stem}]({p.name})" for p in images)
    (out / "report.md").write_text(f"# esbox report\n\n{text}\n\n{links}\n")
    click.echo(text)
    click.echo(f"\nWrote {', '.join(str(p) for p in images)} and {out / 'report.md'}")
