"""The CoPES paper's claims at small scale: CoPES against standard ES, and its ablations.

At equal evaluations, on functions (``esbox.optimize``, default options except the ones an
ablation sets): CoPES against OpenAI-ES with their defaults; at fixed N = 64 the number of
subspaces K = 1, 2, 4, 8, per-subspace instead of joint standardization, and standard ES on
all coordinates with sigma scaled by sqrt(K) (``partition=false``); at N = 40 without
antithetic pairs, K = 1..8 down to the paper's N_k = 5. Final values as mean +- standard
error over seeds and evaluations-to-target (ERT) with the ratio to the standard-ES reference.
``--llm`` adds short runs of the shipped arithmetic configs on SmolLM2-135M (CoPES against
OpenAI-ES): held-out accuracy before and after, and the training reward per step.
"""

from __future__ import annotations

import argparse
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from benchmarks import functions, measure, plots
from benchmarks.quality_runs import ESBOX, run_all

TARGETS = (0.5, 1e-2, 1e-4)  # fractions of f(x0) - f_opt
LLM_CONFIGS = {"copes": "examples/llm-arith.yaml", "openai_es": "examples/llm-arith-openai-es.yaml"}
# (group, label, strategy, options); the first of a group is its standard-ES reference
CONFIGS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("defaults", "openai_es (defaults)", "openai_es", {}),
    ("defaults", "copes (defaults)", "copes", {}),
    ("N = 64", "openai_es", "openai_es", {"population": 64}),
    *[("N = 64", f"copes K = {k}", "copes", {"population": 64, "subspaces": k})
      for k in (1, 2, 4, 8)],
    ("N = 64", "copes K = 4, per-subspace standardization", "copes",
     {"population": 64, "subspaces": 4, "standardization": "per_subspace"}),
    ("N = 64", "standard ES, sigma x sqrt(4) (partition=false, K = 4)", "copes",
     {"population": 64, "subspaces": 4, "partition": False}),
    *[("N = 40, no antithetic", f"copes K = {k}", "copes",
       {"population": 40, "subspaces": k, "antithetic": False}) for k in (1, 2, 4, 8)],
]  # fmt: skip


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks copes", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="d = 100, 2,000 evaluations, 3 seeds, sphere and Rastrigin",
    )
    parser.add_argument("--d", type=int, default=None, help="dimension (default 1000)")
    parser.add_argument(
        "--budget", type=int, default=None, help="evaluations per run (default 20,000)"
    )
    parser.add_argument("--seeds", type=int, default=None, help="runs per cell (default 5)")
    parser.add_argument(
        "--functions", default=None, help="comma-separated (default sphere,rastrigin,rosenbrock)"
    )
    measure.add_jobs_option(parser)
    parser.add_argument(
        "--llm",
        action="store_true",
        help="also the LLM arithmetic task on SmolLM2-135M (slow: ~15 minutes)",
    )
    parser.add_argument("--llm-steps", type=int, default=10, help="updates per LLM run")
    parser.add_argument("--llm-seeds", type=int, default=3, help="LLM runs per strategy")
    parser.add_argument(
        "--llm-heldout", type=int, default=100, help="held-out questions scored before and after"
    )
    measure.add_output_option(parser)
    return parser  # fmt: skip


def function_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    d = args.d or (100 if args.quick else 1000)
    budget = args.budget or (2_000 if args.quick else 20_000)
    seeds = args.seeds or (3 if args.quick else 5)
    default = "sphere,rastrigin" if args.quick else "sphere,rastrigin,rosenbrock"
    names = [n.strip() for n in (args.functions or default).split(",") if n.strip()]
    for name in names:
        functions.problem(name)
    return [
        {"method": ESBOX + strategy, "options": options, "label": label, "group": group,
         "problem": name, "d": d, "seed": seed, "budget": budget, "max_seconds": 1e9,
         "targets": TARGETS}
        for name in names for group, label, strategy, options in CONFIGS
        for seed in range(seeds)
    ]  # fmt: skip


def function_tables(results: list[dict[str, Any]]) -> tuple[str, dict[str, Any], dict]:
    """Per function: a row per configuration with mean +- s.e. and ERT (ratio to reference)."""
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        cells[(r["problem"], r["group"], r["label"])].append(r)
    headers = ["group", "configuration", "N_k", "final f, mean +- s.e.",
               *(f"ERT {t:g} (x ref.)" for t in TARGETS)]  # fmt: skip
    text, tables, stats = [], {}, {}
    for problem in dict.fromkeys(r["problem"] for r in results):
        rows = []
        reference: dict[str, list[float]] = {}
        for group, label, _, options in CONFIGS:
            runs = cells[(problem, group, label)]
            mean, se = functions.standard_error([r["best"] for r in runs])
            erts = [functions.ert([r["hits"][i] for r in runs], [r["evaluations"] for r in runs])
                    for i in range(len(TARGETS))]  # fmt: skip
            reference.setdefault(group, [e for e, _ in erts])
            stats[(problem, group, label)] = (mean, se)
            ratios = [_ratio(e, ref) for (e, _), ref in zip(erts, reference[group], strict=True)]
            rows.append([group, label, _members_per_subspace(options),
                         f"{functions.fmt(mean)} +- {functions.fmt(se)}",
                         *(f"{functions.fmt(e)} ({s:.0%}; {q})"
                           for (e, s), q in zip(erts, ratios, strict=True))])  # fmt: skip
        first = cells[(problem, CONFIGS[0][0], CONFIGS[0][1])]
        text += [f"### {functions.PROBLEMS[problem]}, d = {first[0]['d']:,}, "
                 f"{first[0]['budget']:,} evaluations, {len(first)} seeds",
                 "", measure.table(headers, rows, "lll" + "r" * (len(headers) - 3)),
                 ""]  # fmt: skip
        tables[f"copes_{problem}"] = (headers, rows)
    return "\n".join(text), tables, stats


def _members_per_subspace(options: dict[str, Any]) -> str:
    n = options.get("population")
    if n is None:
        return "default"
    k = options.get("subspaces", 1) if options.get("partition", True) else 1
    return str(n // k)


def _ratio(value: float, reference: float) -> str:
    if math.isinf(value) or math.isinf(reference):
        return "-"
    return f"{value / reference:.2f}x"


def k_figure(stats: dict, path: str) -> Any:
    """Final value against K, per function: N = 64 (antithetic) and N = 40 (no antithetic)."""
    panels: dict[str, dict[str, plots.Series]] = {}
    for problem in dict.fromkeys(k[0] for k in stats):
        series = {}
        for group in ("N = 64", "N = 40, no antithetic"):
            ks = [1, 2, 4, 8]
            points = [stats[(problem, group, f"copes K = {k}")] for k in ks]
            series[f"copes, {group}"] = (
                [*ks],
                [m for m, _ in points],
                [m - s for m, s in points],
                [m + s for m, s in points],
            )
        panels[functions.PROBLEMS[problem]] = series
    return plots.save_panels(path, panels, xlabel="subspaces K", ylabel="final f (mean +- s.e.)",
                             logx=True, logy=True)  # fmt: skip


def llm_section(args: argparse.Namespace) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Short runs of the shipped arithmetic configs, CoPES against OpenAI-ES, in children."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for strategy, config in LLM_CONFIGS.items():
        runs[strategy] = []
        for seed in range(args.llm_seeds):
            spec = {"config": config, "seed": seed, "steps": args.llm_steps,
                    "heldout": args.llm_heldout, "threads": 1, "overrides": []}  # fmt: skip
            runs[strategy].append(measure.run_child("benchmarks.copes_children", spec))
            print(f"llm {strategy} seed {seed}: {runs[strategy][-1]['seconds']:.0f} s", flush=True)
    headers = ["strategy", "runs", "held-out before", "held-out after, mean +- s.e.",
               "train reward, last half of steps", "s / update (with 2 validations)"]  # fmt: skip
    rows = []
    for strategy, rs in runs.items():
        after = functions.standard_error([r["val_after"] for r in rs])
        half = [sum(r["reward"][len(r["reward"]) // 2 :]) / math.ceil(len(r["reward"]) / 2)
                for r in rs]  # fmt: skip
        reward = functions.standard_error(half)
        per_step = sum(r["seconds"] for r in rs) / sum(r["steps"] for r in rs)
        rows.append([strategy, len(rs), f"{rs[0]['val_before']:.3f}",
                     f"{after[0]:.3f} +- {after[1]:.3f}", f"{reward[0]:.3f} +- {reward[1]:.3f}",
                     f"{per_step:.1f}"])  # fmt: skip
    text = "\n".join([f"### LLM arithmetic (SmolLM2-135M), {args.llm_steps} updates, "
                      f"{args.llm_heldout} held-out questions", "",
                      measure.table(headers, rows), ""])  # fmt: skip
    return text, {"copes_llm": (headers, rows)}, runs


def llm_figure(runs: dict[str, list[dict[str, Any]]], path: str) -> Any:
    """Mean training reward per update, mean +- s.e. over seeds."""
    series = {}
    for strategy, rs in runs.items():
        steps = min(len(r["reward"]) for r in rs)
        points = [functions.standard_error([r["reward"][t] for r in rs]) for t in range(steps)]
        series[strategy] = (list(range(1, steps + 1)), [m for m, _ in points],
                            [m - s for m, s in points], [m + s for m, s in points])  # fmt: skip
    return plots.save_panels(path, {"LLM arithmetic: training reward": series},
                             xlabel="update", ylabel="mean reward")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    try:
        specs = function_runs(args)
    except ValueError as error:
        cli.error(str(error))
    elapsed = measure.stopwatch()
    print("## CoPES against standard ES, and the paper's ablations, at small scale\n")
    print(f"Environment: {measure.environment()}. {len(specs)} function runs over "
          f"{args.jobs} worker(s); x0 ~ U[-4, 4]^d per seed; ERT in evaluations to "
          "f_opt + fraction x (f(x0) - f_opt), with the success rate and the ratio to the "
          "group's first row (standard ES).\n", flush=True)  # fmt: skip
    results = run_all(specs, args.jobs)
    text, tables, stats = function_tables(results)
    print(text)
    files = [k_figure(stats, os.path.join(args.csv, "copes_k.png"))]
    if args.llm:
        text, found, runs = llm_section(args)
        print(text)
        tables.update(found)
        files.append(llm_figure(runs, os.path.join(args.csv, "copes_llm.png")))
    written = measure.write_tables(args.csv, tables)
    print(f"Wrote {len(written)} CSV files and {', '.join(map(str, files))} "
          f"({elapsed():.0f} s in all).")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
