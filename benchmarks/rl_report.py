"""The report of ``python -m benchmarks rl``: per-question statistics (means, standard errors,
paired differences against the base model), its markdown tables and the accuracy-against-CPU
figure."""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

from benchmarks import measure
from esbox.adapters.tasks.paired import standard_error

ES_METHODS = ("copes", "openai_es")
STOPS = {"cpu": "max_cpu_seconds", "wall": "max_seconds"}


def clock_name(args: argparse.Namespace) -> str:
    """What the budget counts: CPU-minutes, or wall-minutes (one GPU: GPU-minutes)."""
    return "CPU-minutes" if getattr(args, "clock", "cpu") == "cpu" else "GPU-minutes (wall)"


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of per-question values."""
    return statistics.fmean(values), standard_error(values)


def per_question(scores: list[dict[str, Any]]) -> list[float]:
    """Each question's greedy correctness, averaged over the seeds' models."""
    return [statistics.fmean(column) for column in zip(*(s["greedy"] for s in scores), strict=True)]


def pass_at(scores: list[dict[str, Any]], k: int) -> float | None:
    """pass@k over the seeds' models (the mean of each model's figure)."""
    values = [s["figures"].get(f"pass@{k}") for s in scores]
    return statistics.fmean(values) if values and None not in values else None


def _fmt(value: float | None, digits: int = 3) -> str:
    return (
        "—"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (f"{value:.{digits}f}")
    )


def report(result: dict[str, Any], methods: list[str], args: argparse.Namespace) -> tuple[str, Any]:
    """The task's markdown: tuning table, held-out table, notes; and the CSV tables."""
    task, base = result["task"], result["base"]
    base_q = [float(x) for x in base["greedy"]]
    base_acc, base_se = mean_se(base_q)
    ks = [k for k in (1, 4, 8) if k <= args.samples]
    tune_rows = [
        [
            r.method,
            ", ".join(f"{k}={v:.3g}" for k, v in r.setting.items()),
            _fmt(r.results["validation_accuracy"]),
            r.results["steps"],
            "**chosen**" if result["chosen"][r.method] is r else "",
        ]
        for r in result["tuning"]
    ]
    tune_headers = ["method", "setting", "validation accuracy", "steps", ""]
    gains: dict[str, float] = {}
    rows = [
        [
            "base",
            _fmt(base_acc),
            _fmt(base_se),
            "—",
            "—",
            "—",
            *(_fmt(base["figures"].get(f"pass@{k}")) for k in ks),
            "—",
            "—",
            "—",
            "—",
        ]
    ]
    for method in methods:
        finals = [r for r in result["finals"] if r.method == method]
        scores = [result["scores"][r.directory] for r in finals]
        q = per_question(scores)
        acc, se = mean_se(q)
        change, change_se = mean_se([a - b for a, b in zip(q, base_q, strict=True)])
        gains[method] = change
        gained = sum(a > b for a, b in zip(q, base_q, strict=True))
        lost = sum(a < b for a, b in zip(q, base_q, strict=True))
        rows.append(
            [
                method,
                _fmt(acc),
                _fmt(se),
                f"{change:+.3f} ± {change_se:.3f}",
                f"{gained} / {lost}",
                "",
                *(_fmt(pass_at(scores, k)) for k in ks),
                _fmt(statistics.fmean(r.results["samples"] or 0 for r in finals), 0),
                _fmt(max(r.results["peak_rss_mib"] or 0 for r in finals), 0),
                _fmt(statistics.fmean(r.results["cpu_seconds"] or 0 for r in finals), 0),
                _fmt(statistics.fmean(r.results["steps"] for r in finals), 1),
            ]
        )
    grpo_gain = gains.get("grpo")
    for row in rows[1:]:
        method = row[0]
        if method in ES_METHODS and grpo_gain is not None:
            row[5] = f"{gains[method] / grpo_gain:.0%}" if grpo_gain > 0 else "GRPO gained nothing"
        else:
            row[5] = "—"
    headers = [
        "method",
        "held-out accuracy",
        "SE",
        "change vs base (paired SE)",
        "questions gained / lost",
        "fraction of GRPO's gain",
        *(f"pass@{k}" for k in ks),
        "samples a run",
        "peak RSS MiB",
        "CPU s a run",
        "steps a run",
    ]
    tuned = (
        f"{args.tuning} tuning run(s) a method on questions 0-{args.validation - 1} of the "
        "held-out split"
        if args.tuning > 1
        else "no tuning (one setting a method, the configs' own)"
    )
    notes = [
        f"- {tuned}; {args.seeds} seed(s) of the chosen setting, each "
        f"{args.cpu_minutes:g} {clock_name(args)}; tested on questions {args.validation}-"
        f"{args.validation + args.heldout - 1} (accuracy: greedy, mean over seeds; pass@k: "
        f"{args.samples} sampled rollouts a question)."
    ]
    early = sorted(
        {
            f"{r.method} seed {r.seed} ({r.results['stop_reason']})"
            for r in result["tuning"] + result["finals"]
            if r.results["stop_reason"] != STOPS[getattr(args, "clock", "cpu")]
        }
    )
    if early:
        notes.append(f"- **Not at equal CPU time**: stopped before the budget: {', '.join(early)}.")
    if args.tuning < 3 or args.seeds < 2:
        notes.append("- **Not a result**: fewer than 3 tuning runs a method or 2 seeds.")
    text = "\n".join(
        [
            f"### {task}: tuning (validation split)",
            "",
            measure.table(tune_headers, tune_rows),
            "",
            f"### {task}: held-out test at {args.cpu_minutes:g} {clock_name(args)} a run",
            "",
            measure.table(headers, rows, "l" + "r" * (len(headers) - 1)),
            "",
            *notes,
        ]
    )
    return text, {f"rl_{task}_tuning": (tune_headers, tune_rows), f"rl_{task}": (headers, rows)}


def figure(results: list[dict[str, Any]], methods: list[str], args: argparse.Namespace) -> Path:
    """Held-out accuracy against CPU-minutes: the base at 0, each seed's model at its CPU time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        base = statistics.fmean(result["base"]["greedy"])
        for method in methods:
            finals = [r for r in result["finals"] if r.method == method]
            xs = [0.0] + [(r.results["cpu_seconds"] or 0) / 60 for r in finals]
            ys = [base] + [
                statistics.fmean(result["scores"][r.directory]["greedy"]) for r in finals
            ]
            ax.plot(xs, ys, "o", label=method)
            ax.plot(
                [0, statistics.fmean(xs[1:])],
                [base, statistics.fmean(ys[1:])],
                "-",
                color=ax.lines[-1].get_color(),
                alpha=0.6,
            )
        ax.set(title=result["task"], xlabel="CPU-minutes of training", ylabel="held-out accuracy")
        ax.legend()
    path = Path(args.csv) / "rl.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
