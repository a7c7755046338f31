"""Solution quality at a fixed budget: esbox's strategies (default options) against the peers.

Every registered esbox strategy (or ``--strategies``) runs as
``esbox.optimize(f, x0, strategy=name, budget=B, seed=s)`` with no other option; each peer is
set up the way its docs recommend (:mod:`benchmarks.peers`). Functions: sphere, ellipsoid
(separable and rotated), Rosenbrock, Rastrigin, Ackley and bent cigar at d = 100, 1000, 10^4,
plus sphere at d = 10^5, from x0 ~ U[-4, 4]^d, 10 seeds. Reported per (function, d, method):
the median final value with quartiles, COCO's expected running time (ERT) to the targets
f_opt + {1e-1, 1e-3, 1e-6} (f(x0) - f_opt) with success rates. Runs are spread over ``--jobs``
single-threaded worker processes (no timing is compared, so this does not distort anything).
"""

from __future__ import annotations

import argparse
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from benchmarks import functions, measure, plots
from benchmarks.peers import PEERS, split_available
from benchmarks.quality_runs import ESBOX, run_all

# d -> evaluations per run (50 d, 10 d, d, d / 10): what 2 shared cores finish in about an hour
BUDGETS = {100: 5_000, 1_000: 10_000, 10_000: 10_000, 100_000: 10_000}
QUICK_BUDGETS = {20: 600, 200: 1_000}
QUALITY_PEERS = ("ng-NGOpt", "ng-DiagonalCMA", "pycma", "evosax-SNES", "evotorch-SNES")
BIG_D = 100_000  # from here: sphere only, and only the peers that cost < 1 ms an evaluation
BIG_D_PROBLEMS = ("sphere",)
BIG_D_PEERS = ("pycma", "evosax-SNES", "evotorch-SNES")
Key = tuple[str, int, str]


def parse_budgets(text: str) -> dict[int, int]:
    """``"100:10000,1000:20000"`` -> {100: 10000, 1000: 20000}."""
    try:
        pairs = [item.split(":") for item in text.split(",") if item.strip()]
        return {int(d): int(b) for d, b in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--budgets takes d:evaluations,..., got {text!r}"
        ) from None


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks quality", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="d = 20, 200; 3 seeds; sphere, "
        "Rastrigin, rotated ellipsoid (a smoke run, well under 3 minutes)",
    )
    parser.add_argument("--seeds", type=int, default=None, help="runs per cell (default 10)")
    parser.add_argument(
        "--budgets",
        type=parse_budgets,
        default=None,
        help="d:evaluations pairs (default "
        + ",".join(f"{d}:{b}" for d, b in BUDGETS.items())
        + ")",
    )
    parser.add_argument(
        "--functions", default=None, help=f"comma-separated, of: {', '.join(functions.PROBLEMS)}"
    )
    measure.add_method_options(parser, QUALITY_PEERS, known=PEERS)
    measure.add_jobs_option(parser)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=600.0,
        help="wall-clock cap of one run (default 600; a capped run says so)",
    )
    measure.add_output_option(parser)
    return parser  # fmt: skip


def plan(args: argparse.Namespace, methods: list[str]) -> list[dict[str, Any]]:
    """Every run: (method, problem, d, seed) with its budget, heaviest first."""
    budgets = args.budgets or (QUICK_BUDGETS if args.quick else BUDGETS)
    seeds = args.seeds or (3 if args.quick else 10)
    quick_problems = "sphere,rastrigin,rotated_ellipsoid"
    names = args.functions or (quick_problems if args.quick else ",".join(functions.PROBLEMS))
    problems = [n.strip() for n in names.split(",") if n.strip()]
    for name in problems:
        functions.problem(name)  # unknown names fail here, before any run
    specs = []
    for d, budget in sorted(budgets.items(), reverse=True):
        big = d >= BIG_D
        for name in [p for p in problems if not big or p in BIG_D_PROBLEMS]:
            for method in [
                m for m in methods if not big or m in BIG_D_PEERS or m.startswith(ESBOX)
            ]:
                for seed in range(seeds):
                    specs.append({"method": method, "problem": name, "d": d, "seed": seed,
                                  "budget": budget, "max_seconds": args.max_seconds})  # fmt: skip
    return specs


def label(method: str) -> str:
    return method[len(ESBOX) :] if method.startswith(ESBOX) else method


def summarize(results: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Per (problem, d, method): quartiles of the final value, ERT and success per target."""
    groups: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[(r["problem"], r["d"], r["method"])].append(r)
    cells = {}
    for key, runs in groups.items():
        median, q1, q3 = functions.quartiles([r["best"] for r in runs])
        evaluations = [r["evaluations"] for r in runs]
        erts = [
            functions.ert([r["hits"][i] for r in runs], evaluations)
            for i in range(len(functions.TARGETS))
        ]
        cells[key] = {
            "median": median, "q1": q1, "q3": q3, "erts": erts, "runs": len(runs),
            "f0": functions.quartiles([r["f0"] for r in runs])[0],
            "budget": runs[0]["budget"], "seconds": sum(r["seconds"] for r in runs) / len(runs),
            "capped": sum(r["stop"] == "max_seconds" for r in runs),
            "errors": sum(r["stop"].startswith("error") for r in runs),
        }  # fmt: skip
    return cells


def _ert_cell(value: float, success: float) -> str:
    return f"{functions.fmt(value)} ({success:.0%})"


def tables(cells: dict[Key, dict[str, Any]], methods: list[str]) -> tuple[str, dict[str, Any]]:
    """One markdown table per d, a summary table; and the same as CSV tables."""
    targets = [f"ERT {t:g} (succ.)" for t in functions.TARGETS]
    headers = ["function", "method", "median [Q1, Q3]", *targets, "s / run"]
    text, csv_tables = [], {}
    for d in sorted({k[1] for k in cells}):
        rows = []
        for problem in functions.PROBLEMS:
            for method in methods:
                c = cells.get((problem, d, method))
                if c is None:
                    continue
                capped = f" ({c['capped']} capped)" if c["capped"] else ""
                capped += f" ({c['errors']} failed, see quality_runs.csv)" if c["errors"] else ""
                rows.append([
                    functions.PROBLEMS[problem], label(method),
                    f"{functions.fmt(c['median'])} [{functions.fmt(c['q1'])}, "
                    f"{functions.fmt(c['q3'])}]",
                    *(_ert_cell(e, s) for e, s in c["erts"]), f"{c['seconds']:.1f}{capped}",
                ])  # fmt: skip
        some = next(c for k, c in cells.items() if k[1] == d)
        text += [f"### d = {d:,} (budget {some['budget']:,} evaluations, {some['runs']} seeds)",
                 "", measure.table(headers, rows, "ll" + "r" * (len(headers) - 2)), ""]  # fmt: skip
        csv_tables[f"quality_d{d}"] = (headers, rows)
    summary_headers, summary = summary_table(cells, methods)
    text += ["### Summary: best esbox strategy against the best peer (medians)", "",
             measure.table(summary_headers, summary), ""]  # fmt: skip
    csv_tables["quality_summary"] = (summary_headers, summary)
    return "\n".join(text), csv_tables


def summary_table(
    cells: dict[Key, dict[str, Any]], methods: list[str]
) -> tuple[list[str], list[list[Any]]]:
    """Per (function, d): the best esbox median, the best peer median, and who is ahead."""
    headers = ["function", "d", "f(x0)", "best esbox", "best peer", "esbox / peer", "ahead"]
    rows = []
    for problem in functions.PROBLEMS:
        for d in sorted({k[1] for k in cells}):
            mine = [(cells[(problem, d, m)]["median"], label(m)) for m in methods
                    if m.startswith(ESBOX) and (problem, d, m) in cells]  # fmt: skip
            theirs = [(cells[(problem, d, m)]["median"], m) for m in methods
                      if not m.startswith(ESBOX) and (problem, d, m) in cells]  # fmt: skip
            if not mine:
                continue
            best_mine = min(mine)
            best_theirs = min(theirs) if theirs else (math.nan, "-")
            f0 = cells[(problem, d, methods[0])]["f0"] if (problem, d, methods[0]) in cells else 0
            ratio = best_mine[0] / best_theirs[0] if best_theirs[0] > 0 else math.nan
            ahead = "-" if not theirs else ("esbox" if best_mine[0] < best_theirs[0] else "peer")
            rows.append([
                functions.PROBLEMS[problem], f"{d:,}", functions.fmt(f0),
                f"{best_mine[1]} {functions.fmt(best_mine[0])}",
                f"{best_theirs[1]} {functions.fmt(best_theirs[0])}", functions.fmt(ratio), ahead,
            ])  # fmt: skip
    return headers, rows


def figure(cells: dict[Key, dict[str, Any]], methods: list[str], path: Any) -> Any:
    """Median final f / f(x0) against d per function, quartile bands, one line per method."""
    panels: dict[str, dict[str, plots.Series]] = {}
    for problem in functions.PROBLEMS:
        series = {}
        for method in methods:
            keys = sorted(k for k in cells if k[0] == problem and k[2] == method)
            if not keys:
                continue
            f0 = [cells[k]["f0"] for k in keys]
            series[label(method)] = (
                [k[1] for k in keys],
                [max(cells[k]["median"] / f, 1e-16) for k, f in zip(keys, f0, strict=True)],
                [max(cells[k]["q1"] / f, 1e-16) for k, f in zip(keys, f0, strict=True)],
                [max(cells[k]["q3"] / f, 1e-16) for k, f in zip(keys, f0, strict=True)],
            )
        if series:
            panels[functions.PROBLEMS[problem]] = series
    return plots.save_panels(path, panels, xlabel="dimension d", ylabel="median f / f(x0)",
                             logx=True, logy=True)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    try:
        strategies = measure.esbox_strategies(args.strategies)
        peers, notes = split_available([p.strip() for p in args.peers.split(",") if p.strip()])
        methods = [ESBOX + s for s in strategies] + peers
        specs = plan(args, methods)
    except ValueError as error:
        cli.error(str(error))
    elapsed = measure.stopwatch()
    print("## Quality at a fixed budget: esbox (default options) against the peers\n")
    print(
        f"Environment: {measure.environment()}; "
        f"{measure.versions(['nevergrad', 'cma', 'evosax', 'jax', 'evotorch'])}."
    )
    for note in notes:
        print(f"* {note}")
    print(f"\n{len(specs)} runs over {args.jobs} worker(s); x0 ~ U[-4, 4]^d per seed; "
          "values are f (lower is better); ERT in evaluations, inf when no run reached the "
          "target.\n", flush=True)  # fmt: skip
    results = run_all(specs, args.jobs)
    cells = summarize(results)
    text, csv_tables = tables(cells, methods)
    print(text)
    ahead = [r for r in csv_tables["quality_summary"][1] if int(r[1].replace(",", "")) >= 1000]
    wins = sum(r[-1] == "esbox" for r in ahead)
    print(f"esbox's best strategy is ahead of the best peer's median on {wins} of {len(ahead)} "
          "rows at d >= 1000.\n")  # fmt: skip
    run_headers = ["method", "problem", "d", "seed", "budget", "f0", "best", "evaluations",
                   *(f"hit {t:g}" for t in functions.TARGETS), "seconds", "stop"]  # fmt: skip
    run_rows = [[label(r["method"]), r["problem"], r["d"], r["seed"], r["budget"], r["f0"],
                 r["best"], r["evaluations"], *r["hits"], f"{r['seconds']:.2f}", r["stop"]]
                for r in results]  # fmt: skip
    csv_tables["quality_runs"] = (run_headers, run_rows)
    written = measure.write_tables(args.csv, csv_tables)
    png = figure(cells, methods, os.path.join(args.csv, "quality.png"))
    print(f"Wrote {len(written)} CSV files and {png} ({elapsed():.0f} s in all).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
