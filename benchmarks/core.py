"""Core benchmarks: peak memory is independent of the population; time per generation.

Three tables, each row measured in its own subprocess (:mod:`benchmarks.core_children`) so
that memory peaks never mix:

1. peak RSS of ``esbox.optimize(rastrigin, x0, strategy="copes")`` for N = 16 and N = 256 at
   d = 10^7 (target: N = 256 at most 1.2x N = 16);
2. time per generation at d = 10^6, N = 256, split into ask / perturb / evaluate / restore /
   tell / apply, for copes and openai_es, next to a naive explicit-noise implementation;
3. peak memory of seed replay against the naive implementation, which materialises the
   N x d noise matrix (at d = 10^6, where that matrix still fits).

Run ``python -m benchmarks core``; ``--quick`` shrinks the sizes for a smoke run. Tables are
printed as markdown (``--csv DIR`` also writes each as CSV). Seed replay is why the peak does
not grow: no noise is stored, every member's noise is regenerated chunk by chunk from its seeds.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from benchmarks import measure
from benchmarks.core_children import LEARNING_RATE, PHASES, SIGMA, SUBSPACES

CHILD_MODULE = "benchmarks.core_children"
CHILD_TIMEOUT = 1800
Tables = dict[str, tuple[list[str], list[list[Any]]]]
Child = Callable[..., dict[str, Any]]


def run_child(
    kind: str, *, threads: int, mmap_threshold: int | None, **kwargs: Any
) -> dict[str, Any]:
    """One core measurement in a fresh interpreter (see :mod:`benchmarks.core_children`)."""
    env = {}
    if mmap_threshold is not None:  # glibc: serve blocks above this by mmap, unmap on free
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    spec = {"kind": kind, "threads": threads, **kwargs}
    return measure.run_child(CHILD_MODULE, spec, env=env, timeout=CHILD_TIMEOUT)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}"


def _power(d: int) -> str:
    exponent = math.log10(d)
    return f"10^{exponent:.0f}" if exponent.is_integer() else f"{d:,}"


def memory_section(
    child: Child, d: int, populations: Sequence[int], steps: int, function: str
) -> tuple[str, Tables]:
    results = {
        n: child("optimize", d=d, population=n, steps=steps, function=function) for n in populations
    }
    x_mib = d * 8 / measure.MIB
    first = results[populations[0]]
    ref_extra = first["peak"] - first["baseline"]
    rows = []
    for n, r in results.items():
        extra = r["peak"] - r["baseline"]
        per_step = " / ".join(f"{p - r['baseline']:,.0f}" for p in r["per_step_peak"])
        rows.append(
            [
                n,
                r["steps"],
                f"{r['baseline']:,.0f}",
                f"{extra:,.0f}",
                per_step,
                f"{extra / x_mib:.2f}",
                f"{extra / ref_extra:.2f}x",
                f"{r['seconds_per_step']:.1f}",
            ]
        )
    headers = [
        "N",
        "steps",
        "baseline RSS (MiB)",
        "peak extra (MiB)",
        "peak extra after each step (MiB)",
        "peak extra / size of x",
        f"vs N = {populations[0]}",
        "s / step",
    ]
    last = results[populations[-1]]
    ratio = (last["peak"] - last["baseline"]) / ref_extra
    verdict = "meets" if ratio <= 1.2 else "MISSES"
    reset = all(r["peak_reset"] for r in results.values())
    note = "" if reset else " (peak counter could not be reset: peaks include start-up)"
    text = "\n".join(
        [
            f"### Peak memory at d = {_power(d)} (`esbox.optimize`, copes, K = {SUBSPACES})",
            "",
            measure.table(headers, rows),
            "",
            f"N = {populations[-1]} uses {ratio:.2f}x the peak extra memory of "
            f"N = {populations[0]}: {verdict} the target of at most 1.2x{note}. "
            f"Size of x = d x 8 bytes = {x_mib:,.0f} MiB.",
        ]
    )
    return text, {"core_memory": (headers, rows)}


def timing_section(
    child: Child, d: int, population: int, steps: int, function: str
) -> tuple[str, Tables, dict[str, Any]]:
    runs = {
        "copes": child(
            "loop", d=d, population=population, steps=steps, strategy="copes", function=function
        ),
        "openai_es": child(
            "loop",
            d=d,
            population=population,
            steps=steps,
            strategy="openai_es",
            function=function,
        ),
        "naive (N x d noise)": child(
            "naive", d=d, population=population, steps=steps, function=function
        ),
    }
    base = sum(runs["openai_es"]["phases"].values())
    rows = []
    for name, r in runs.items():
        total = sum(r["phases"].values())
        rows.append(
            [name, *(_ms(r["phases"][k]) for k in PHASES), _ms(total), f"{total / base:.2f}x"]
        )
    headers = ["strategy", *PHASES, "total", "vs openai_es"]
    text = "\n".join(
        [
            f"### Time per generation at d = {_power(d)}, N = {population} "
            f"(ms, mean of {steps} generations)",
            "",
            measure.table(headers, rows),
            "",
            "perturb/restore are summed over the N members; evaluate is the objective itself. "
            "The naive row samples the noise matrix in ask, builds theta + sigma eps_i in "
            "perturb (nothing to restore) and multiplies the matrix in apply.",
        ]
    )
    return text, {"core_timing": (headers, rows)}, runs


def replay_vs_naive_section(
    child: Child, d: int, populations: Sequence[int], function: str, measured: dict[str, Any]
) -> tuple[str, Tables]:
    rows = []
    for n in populations:
        if n == populations[-1]:
            esbox_run, naive_run = measured["copes"], measured["naive (N x d noise)"]
        else:
            esbox_run = child(
                "loop", d=d, population=n, steps=1, strategy="copes", function=function
            )
            naive_run = child("naive", d=d, population=n, steps=1, function=function)
        esbox_extra = esbox_run["peak"] - esbox_run["baseline"]
        naive_extra = naive_run["peak"] - naive_run["baseline"]
        matrix = n * d * 4 / measure.MIB
        rows.append(
            [
                n,
                f"{matrix:,.0f}",
                f"{esbox_extra:,.0f}",
                f"{naive_extra:,.0f}",
                f"{naive_extra / esbox_extra:.1f}x",
            ]
        )
    headers = ["N", "N x d float32 matrix", "esbox copes", "naive", "naive / esbox"]
    text = "\n".join(
        [
            f"### Seed replay vs an explicit noise matrix at d = {_power(d)} (peak extra MiB)",
            "",
            measure.table(headers, rows),
        ]
    )
    return text, {"core_replay": (headers, rows)}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks core", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument(
        "--steps", type=int, default=1, help="steps of each d = 10^7 memory run (default 1)"
    )
    parser.add_argument(
        "--timing-steps", type=int, default=2, help="generations averaged in the timing table"
    )
    parser.add_argument(
        "--function",
        choices=("blocked", "numpy"),
        default="blocked",
        help="rastrigin evaluated in 2^20 blocks (default) or the library's numpy kernel",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per measurement (default 1: stable on a shared machine)",
    )
    parser.add_argument(
        "--sections",
        default="memory,timing",
        help="comma-separated: memory (d = 10^7 runs), timing (timing and naive tables)",
    )
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=None,
        metavar="BYTES",
        help="set glibc's MALLOC_MMAP_THRESHOLD_ in the measurements, so freed blocks leave "
        "RSS at once and peaks show live memory (default: glibc's dynamic threshold)",
    )
    parser.add_argument(
        "--csv", metavar="DIR", help="also write each table as DIR/core_<table>.csv"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if not sections or sections - {"memory", "timing"}:
        cli.error(f"--sections takes memory and/or timing, got {args.sections!r}")
    child = partial(run_child, threads=args.threads, mmap_threshold=args.mmap_threshold)

    d_memory, d_timing = (10**6, 10**5) if args.quick else (10**7, 10**6)
    populations = (16, 256)
    elapsed = measure.stopwatch()
    tables: Tables = {}
    print("## Core benchmarks: memory and time of seed replay\n")
    print(f"Environment: {measure.environment(args.threads)}.")
    allocator = (
        f"MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}"
        if args.mmap_threshold is not None
        else "glibc default (dynamic mmap threshold)"
    )
    print(
        f"sigma = {SIGMA}, learning rate = {LEARNING_RATE}, objective: rastrigin "
        f"({args.function}), allocator: {allocator}. Every row runs in its own subprocess.\n"
    )
    if "memory" in sections:
        text, found = memory_section(child, d_memory, populations, args.steps, args.function)
        tables.update(found)
        print(text, "\n", flush=True)
    if "timing" in sections:
        text, found, runs = timing_section(
            child, d_timing, populations[-1], args.timing_steps, args.function
        )
        tables.update(found)
        print(text, "\n", flush=True)
        text, found = replay_vs_naive_section(child, d_timing, populations, args.function, runs)
        tables.update(found)
        print(text, "\n")
    print(f"Total wall time: {elapsed():.0f} s (load average at the end {os.getloadavg()[0]:.1f}).")
    measure.write_tables(args.csv, tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
