"""COCO: bbob and bbob-largescale (cocoex), esbox's default and strategies against CMA-ES peers.

bbob at d = 10, 20, 40 and bbob-largescale at d = 80, 160, 320, on a subset of functions and
instances that fits a small machine, budgets of ``--multiplier`` d evaluations (up to 10^4 d).
Methods: esbox's default (``esbox.optimize(f, x0)``, strategy ``auto``) and each esbox
strategy with its default options; pycma CMA-ES with IPOP restarts, pycma sep-CMA (IPOP),
nevergrad NGOpt and DiagonalCMA. Every (method, suite, d) writes a standard COCO data folder
(cocoex ``Observer``) under OUT/exdata; ``cocopp`` turns them into its ECDF plots and tables
offline (OUT/coco-ppdata). The suite also prints the aggregated ECDFs as tables: the fraction
of (function, instance, target) triples reached, COCO's 51 targets f_opt + 10^{2..-8}, at
budgets of 10^k d evaluations and at CPU seconds, and plots both (coco_ecdf.png).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import measure
from benchmarks.coco_runs import PEERS

SUITES = {"bbob": (10, 20, 40), "bbob-largescale": (80, 160, 320)}
# one or two functions of each of COCO's five groups: separable, moderate, ill-conditioned,
# multimodal with and without global structure
FUNCTIONS = (1, 2, 8, 10, 15, 20)
QUICK = {"dims": {"bbob": (10,), "bbob-largescale": ()}, "functions": (1, 15), "multiplier": 100}
PEER_LIBRARIES = {"pycma-ipop": "cma", "pycma-sep": "cma", "ng-NGOpt": "nevergrad",
                  "ng-DiagonalCMA": "nevergrad"}  # fmt: skip
DEFAULT = "esbox:auto"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks coco", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="bbob d = 10, functions 1 and 15, one instance, 100 d evaluations",
    )
    p.add_argument(
        "--dims",
        default=None,
        help="comma-separated (default 10,20,40,80,160,320; "
        "d <= 40 runs bbob, larger d bbob-largescale)",
    )
    p.add_argument(
        "--functions",
        default=None,
        help=f"function indices 1-24 (default {','.join(map(str, FUNCTIONS))})",
    )
    p.add_argument("--instances", default=None, help="instance indices (default 1,2)")
    p.add_argument(
        "--multiplier",
        type=float,
        default=None,
        help="budget in evaluations per dimension (default 1000; COCO uses up to 1e4)",
    )
    p.add_argument(
        "--strategies",
        default=None,
        help="esbox strategies besides the default, comma-separated (default: every "
        "registered one except ng: families; '' for none)",
    )
    p.add_argument("--peers", default=",".join(PEERS), help=f"of {', '.join(PEERS)}")
    measure.add_jobs_option(p)
    measure.add_output_option(p)
    p.add_argument("--no-cocopp", action="store_true", help="skip cocopp's post-processing")
    p.add_argument(
        "--from-rows",
        action="store_true",
        help="tabulate OUT/coco_rows.jsonl of an earlier (or cut-short) run, run nothing",
    )
    return p  # fmt: skip


def _ints(text: str | None, default: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip()) if text else tuple(default)


def plan(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(one spec per method, suite and d; the methods; notes on skipped peers)."""
    from esbox import available_strategies

    if args.strategies is None:
        strategies = list(available_strategies())
    else:
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    methods = [DEFAULT, *(f"esbox:{s}" for s in strategies)]
    notes = []
    for peer in [p.strip() for p in args.peers.split(",") if p.strip()]:
        if peer not in PEERS:
            raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")
        try:
            __import__(PEER_LIBRARIES[peer])
        except ImportError:
            notes.append(f"{peer}: skipped, `{PEER_LIBRARIES[peer]}` is not installed")
            continue
        methods.append(peer)
    if args.dims:
        dims = _ints(args.dims, ())
        by_suite = {s: tuple(d for d in dims if (d > 40) == (s == "bbob-largescale"))
                    for s in SUITES}  # fmt: skip
    else:
        by_suite = QUICK["dims"] if args.quick else SUITES
    functions = _ints(args.functions, QUICK["functions"] if args.quick else FUNCTIONS)
    instances = _ints(args.instances, (1,) if args.quick else (1, 2))
    multiplier = args.multiplier or (QUICK["multiplier"] if args.quick else 1000)
    root = str(Path(args.csv).resolve())
    specs = []
    for suite, dims in by_suite.items():
        for d in dims:
            for method in methods:
                name = f"{label(method)}-{suite}-d{d}"
                specs.append({"method": method, "suite": suite, "d": d, "functions": functions,
                              "instances": instances, "multiplier": multiplier,
                              "folder": name, "root": root,
                              "algorithm": label(method)})  # fmt: skip
    specs.sort(key=lambda s: s["d"])  # the smallest first: a cut-short run has whole d rows
    return specs, methods, notes


def label(method: str) -> str:
    if method == DEFAULT:
        return "esbox-default"
    return f"esbox-{method[6:]}" if method.startswith("esbox:") else method


def run_all(specs: list[dict[str, Any]], jobs: int, log: Path) -> list[dict[str, Any]]:
    """Every spec in ``jobs`` spawned one-thread workers; each finished spec's rows are also
    appended to ``log`` (JSON lines), so ``--from-rows`` can tabulate a cut-short run."""
    import json
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from benchmarks.coco_runs import run
    from benchmarks.quality_runs import init_worker

    context = multiprocessing.get_context("spawn")
    rows = []
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=init_worker) as pool:
        for future in as_completed([pool.submit(run, spec) for spec in specs]):
            result = future.result()
            rows.extend(result)
            with open(log, "a") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in result)
            print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def ecdf_at(rows: list[dict[str, Any]], axis: str, x: float) -> float:
    """Fraction of (problem, target) pairs reached within ``x`` (evaluations / d, or CPU
    seconds), over ``rows``."""
    index = 0 if axis == "evaluations" else 1
    hit = total = 0
    for r in rows:
        scale = r["d"] if axis == "evaluations" else 1.0
        for h in r["hits"]:
            total += 1
            hit += h is not None and h[index] / scale <= x
    return hit / total if total else float("nan")


def tables(rows: list[dict[str, Any]], methods: list[str]) -> tuple[str, dict[str, Any]]:
    """Per suite and d, the aggregated ECDF of each method at budgets of 10^k d evaluations
    and at CPU seconds (the fraction of targets reached)."""
    groups: dict[tuple[str, int], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(r["suite"], r["d"])][r["method"]].append(r)
    text, csv_tables = [], {}
    for (suite, d), by_method in sorted(groups.items(), key=lambda kv: kv[0][1]):
        some = next(iter(by_method.values()))
        top = some[0]["budget"] / d
        marks = [m for m in (1, 10, 100, 1000, 10_000) if m <= top]
        seconds = (0.1, 1.0, 10.0)
        headers = ["method", *(f"{m:g} d evals" for m in marks), *(f"{s:g} CPU s" for s in seconds),
                   "CPU s / run", "failed"]  # fmt: skip
        body = []
        for method in methods:
            runs = by_method.get(method)
            if not runs:
                continue
            failed = sum(bool(r["error"]) for r in runs)
            body.append([label(method), *(f"{ecdf_at(runs, 'evaluations', m):.3f}" for m in marks),
                         *(f"{ecdf_at(runs, 'cpu', s):.3f}" for s in seconds),
                         f"{sum(r['cpu_seconds'] for r in runs) / len(runs):.2f}",
                         failed])  # fmt: skip
        functions = sorted({r["function"] for r in some})
        instances = sorted({r["instance"] for r in some})
        text += [f"### {suite}, d = {d}: functions {functions}, instances {instances}, budget "
                 f"{top:g} d", "", measure.table(headers, body), ""]  # fmt: skip
        csv_tables[f"coco_{suite}_d{d}"] = (headers, body)
    return "\n".join(text), csv_tables


def figure(rows: list[dict[str, Any]], methods: list[str], path: str) -> str:
    """ECDFs against evaluations / d (top) and CPU seconds (bottom), one column per (suite, d)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = sorted({(r["d"], r["suite"]) for r in rows})
    fig, axes = plt.subplots(2, len(keys), figsize=(3.2 * len(keys), 6), squeeze=False)
    for col, (d, suite) in enumerate(keys):
        here = [r for r in rows if r["d"] == d]
        top = max(r["budget"] for r in here) / d
        for i, method in enumerate(methods):
            runs = [r for r in here if r["method"] == method]
            if not runs:
                continue
            style = {"color": f"C{i % 10}", "label": label(method),
                     "linewidth": 2.5 if method == DEFAULT else 1.2}  # fmt: skip
            xs = np.logspace(0, np.log10(top), 60)
            axes[0][col].plot(xs, [ecdf_at(runs, "evaluations", x) for x in xs], **style)
            cpu = max(r["cpu_seconds"] for r in here)
            ts = np.logspace(-3, np.log10(max(cpu, 1e-2)), 60)
            axes[1][col].plot(ts, [ecdf_at(runs, "cpu", t) for t in ts], **style)
        axes[0][col].set_title(f"{suite} d={d}", fontsize="small")
        axes[0][col].set_xlabel("evaluations / d")
        axes[1][col].set_xlabel("CPU seconds")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of targets reached")
    axes[1][0].set_ylabel("fraction of targets reached")
    axes[0][-1].legend(fontsize="x-small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def merge_folders(data: Path, merged: Path) -> dict[str, list[Path]]:
    """One COCO data folder per (method, suite) from the per-d folders the workers wrote (the
    ``.info`` files concatenated, the data files, named by d, side by side): cocopp then sees
    one algorithm per method. Returns the merged folders by suite."""
    import shutil

    by_suite: dict[str, list[Path]] = defaultdict(list)
    shutil.rmtree(merged, ignore_errors=True)
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        name, _, _ = folder.name.rpartition("-d")
        target = merged / name
        if not target.exists():
            by_suite["bbob-largescale" if name.endswith("-largescale") else "bbob"].append(target)
        for path in folder.rglob("*"):
            if path.is_file():
                out = target / path.relative_to(folder)
                out.parent.mkdir(parents=True, exist_ok=True)
                text = path.read_text()
                with open(out, "a") as handle:  # .info: the runs of another d appended
                    handle.write(text if text.endswith("\n") else text + "\n")
    return dict(by_suite)


def postprocess(data: Path, out: Path) -> str:
    """cocopp on the local data folders only (no archive lookups), one report per suite under
    ``out``; returns a line saying where."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import cocopp

        cocopp.genericsettings.isConv = False
        lines = []
        for suite, folders in merge_folders(data, data.parent / "exdata-merged").items():
            target = out / suite
            cocopp.main(["-o", str(target), *map(str, folders)])
            lines.append(f"cocopp: {len(folders)} algorithms on {suite} -> {target}/index.html")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    try:
        specs, methods, notes = plan(args)
    except ValueError as error:
        cli.error(str(error))
    import cocoex  # noqa: F401  (a missing cocoex fails here, before any run)

    elapsed = measure.stopwatch()
    print("## COCO: bbob and bbob-largescale\n")
    print(f"Environment: {measure.environment(threads=1)}; "
          f"{measure.versions(['coco-experiment', 'cocopp', 'cma', 'nevergrad'])}.")  # fmt: skip
    for note in notes:
        print(f"* {note}")
    print(f"\n{len(specs)} (method, suite, d) runs over {args.jobs} worker(s); cells are the "
          "fraction of (function, instance, target) triples reached, COCO's 51 targets "
          "f_opt + 10^{2..-8}.\n", flush=True)  # fmt: skip
    log = Path(args.csv) / "coco_rows.jsonl"
    if args.from_rows:
        wanted = {m for m in methods}
        rows = [r for r in map(json.loads, log.read_text().splitlines()) if r["method"] in wanted]
        args.no_cocopp = args.no_cocopp or not (Path(args.csv) / "exdata").is_dir()
    else:
        Path(args.csv).mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        rows = run_all(specs, args.jobs, log)
    text, csv_tables = tables(rows, methods)
    print(text)
    headers = ["method", "suite", "d", "function", "instance", "evaluations", "budget",
               "best f - f_opt", "cpu seconds", "targets reached", "error"]  # fmt: skip
    csv_tables["coco_runs"] = (headers, [[label(r["method"]), r["suite"], r["d"], r["function"],
        r["instance"], r["evaluations"], r["budget"], r["best"], f"{r['cpu_seconds']:.3f}",
        sum(h is not None for h in r["hits"]), r["error"]] for r in rows])  # fmt: skip
    written = measure.write_tables(args.csv, csv_tables)
    png = figure(rows, methods, os.path.join(args.csv, "coco_ecdf.png"))
    print(f"Wrote {len(written)} CSV files and {png}.")
    if not args.no_cocopp:
        print(postprocess(Path(args.csv) / "exdata", Path(args.csv) / "coco-ppdata"))
    print(f"({elapsed():.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
