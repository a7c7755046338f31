"""Overhead per generation: ask + tell seconds and peak extra RSS, esbox against the peers.

For d in {10^3 .. 10^7} and N in {16, 64, 256}, every measurement in its own subprocess. For
esbox, "ask + tell" is all a user pays per generation except the objective: ask, realising
each member on the space (perturb) and restoring it, tell, and applying the update by replay
(the core suite's ``loop`` child, :mod:`benchmarks.core_children`). For a peer it is its
ask + tell (sampling and holding the N x d population included) with a near-free objective.
Peak extra RSS is the peak above the RSS after imports and x0. A peer is skipped where its
population matrix alone would pass ``--max-population-gib`` or its run passes ``--timeout``;
the table says which. Ratios are to the fastest esbox strategy of the same cell and run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from benchmarks import measure, plots
from benchmarks.core_children import PHASES
from benchmarks.peers import PEERS, split_available

DIMENSIONS = (10**3, 10**4, 10**5, 10**6, 10**7)
POPULATIONS = (16, 64, 256)
OVERHEAD_PEERS = ("ng-DiagonalCMA", "pycma", "evosax-Open_ES", "evosax-SNES", "evotorch-SNES",
                  "evotorch-PGPE")  # fmt: skip
ESBOX_PHASES = [p for p in PHASES if p != "evaluate"]
Cell = dict[str, Any]


def generations_for(d: int) -> int:
    """Generations to average: more where one is cheap (a d = 10^7 generation takes minutes)."""
    return 1 if d >= 10**7 else 2 if d >= 10**6 else 3


def measure_esbox(strategy: str, d: int, n: int, timeout: float) -> Cell:
    """The core suite's timed ask/tell loop, one thread: everything but the objective."""
    spec = {"kind": "loop", "threads": 1, "d": d, "population": n,
            "steps": generations_for(d), "strategy": strategy, "function": "blocked"}  # fmt: skip
    try:
        r = measure.run_child("benchmarks.core_children", spec, timeout=timeout)
    except RuntimeError as error:
        return {"skip": _failure(error, timeout)}
    seconds = sum(r["phases"][p] for p in ESBOX_PHASES)
    return {"seconds": seconds, "extra": r["peak"] - r["baseline"], "phases": r["phases"]}


def measure_peer(
    peer: str, d: int, n: int, timeout: float, max_gib: float, min_seconds: float
) -> Cell:
    """A peer's generations in a child, unless its N x d population would pass ``max_gib``."""
    gib = n * d * PEERS[peer].value_bytes / 2**30
    if gib > max_gib:
        return {"skip": f"skipped: N x d population {gib:.1f} GiB"}
    spec = {"d": d, "population": n, "peer": peer, "generations": generations_for(d),
            "min_seconds": min_seconds}  # fmt: skip
    try:
        r = measure.run_child("benchmarks.overhead_children", spec, timeout=timeout)
    except RuntimeError as error:
        return {"skip": _failure(error, timeout)}
    return {"seconds": r["seconds"], "extra": r["peak"] - r["baseline"], "first": r["first"]}


def _failure(error: RuntimeError, timeout: float) -> str:
    text = str(error)
    if "timed out" in text:
        return f"skipped: over {timeout:.0f} s"
    if "MemoryError" in text or "exit -9" in text:
        return "skipped: out of memory"
    last = [line for line in text.splitlines() if line.strip()][-1]
    return f"failed: {last[:80]}"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="d = 10^3, 10^4 and N = 16, 64 (a smoke run)"
    )
    parser.add_argument("--dims", default=None, help="comma-separated (default 1e3..1e7)")
    parser.add_argument("--populations", default=None, help="comma-separated (default 16,64,256)")
    measure.add_method_options(parser, OVERHEAD_PEERS)
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds one measurement may take before it is skipped (default 600)",
    )
    parser.add_argument(
        "--max-population-gib",
        type=float,
        default=2.0,
        help="skip a peer whose N x d population passes this (default 2 GiB)",
    )
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=2.0,
        help="a peer runs generations until this many seconds (default 2)",
    )
    measure.add_output_option(parser)
    return parser  # fmt: skip


def _sizes(text: str | None, default: Sequence[int]) -> list[int]:
    return [int(float(x)) for x in text.split(",")] if text else list(default)


def report(
    cells: dict[tuple[str, int, int], Cell], methods: list[str], esbox: list[str]
) -> tuple[str, dict[str, Any]]:
    """Time and memory tables (rows (d, N), a column per method) and a long-form CSV."""
    sizes = sorted({(d, n) for _, d, n in cells})
    time_rows, memory_rows, long_rows = [], [], []
    for d, n in sizes:
        mine = [cells[(m, d, n)] for m in esbox if "seconds" in cells[(m, d, n)]]
        theirs = [(cells[(m, d, n)]["seconds"], m) for m in methods
                  if m not in esbox and "seconds" in cells[(m, d, n)]]  # fmt: skip
        fastest = min((c["seconds"] for c in mine), default=None)
        best_peer = min(theirs, default=None)
        ratio = f"{best_peer[0] / fastest:.2f}x" if fastest and best_peer else "-"
        time_rows.append([f"{d:.0e}", n, *(_cell(cells[(m, d, n)], "seconds") for m in methods),
                          best_peer[1] if best_peer else "-", ratio])  # fmt: skip
        memory_rows.append([f"{d:.0e}", n, *(_cell(cells[(m, d, n)], "extra") for m in methods)])
        for m in methods:
            c = cells[(m, d, n)]
            long_rows.append([m, d, n, c.get("seconds", ""), c.get("extra", ""),
                              c.get("first", ""), c.get("skip", "")])  # fmt: skip
    time_headers = ["d", "N", *methods, "fastest peer", "fastest peer / fastest esbox"]
    memory_headers = ["d", "N", *methods]
    text = "\n".join([
        "### Seconds of ask + tell per generation (esbox: ask, perturb + restore of every "
        "member, tell, apply)", "", measure.table(time_headers, time_rows), "",
        "### Peak extra RSS (MiB) in a fresh process", "",
        measure.table(memory_headers, memory_rows), "",
        *_flatness(cells, esbox, sizes),
    ])  # fmt: skip
    long_headers = ["method", "d", "N", "seconds", "peak extra MiB", "first generation s", "note"]
    tables = {"overhead_time": (time_headers, time_rows),
              "overhead_memory": (memory_headers, memory_rows),
              "overhead_runs": (long_headers, long_rows)}  # fmt: skip
    return text, tables


def _cell(cell: Cell, key: str) -> str:
    if key not in cell:
        return cell["skip"]
    return f"{cell[key]:.3g}" if key == "seconds" else f"{cell[key]:,.0f}"


def _flatness(cells: dict[tuple[str, int, int], Cell], esbox: list[str], sizes: list) -> list[str]:
    """One line per esbox strategy: peak extra at the largest N over the smallest, largest d."""
    d = max(s[0] for s in sizes)
    ns = sorted(n for dd, n in sizes if dd == d)
    lines = []
    for m in esbox:
        low, high = cells[(m, d, ns[0])], cells[(m, d, ns[-1])]
        if "extra" in low and "extra" in high and len(ns) > 1:
            lines.append(f"* {m}: at d = {d:.0e}, N = {ns[-1]} uses "
                         f"{high['extra'] / low['extra']:.2f}x the peak extra memory of "
                         f"N = {ns[0]}.")  # fmt: skip
    return lines


def figure(cells: dict[tuple[str, int, int], Cell], methods: list[str], path: str) -> Any:
    """Seconds per generation and peak extra MiB against d, one panel per N and quantity."""
    panels: dict[str, dict[str, plots.Series]] = {}
    for key, name in (("seconds", "s / generation"), ("extra", "peak extra MiB")):
        for n in sorted({k[2] for k in cells}):
            series = {}
            for m in methods:
                points = sorted((d, c[key]) for (mm, d, nn), c in cells.items()
                                if mm == m and nn == n and key in c)  # fmt: skip
                if points:
                    series[m] = ([p[0] for p in points], [max(p[1], 1e-6) for p in points],
                                 None, None)  # fmt: skip
            panels[f"{name}, N = {n}"] = series
    return plots.save_panels(path, panels, xlabel="dimension d", ylabel="", logx=True, logy=True)


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    try:
        esbox = measure.esbox_strategies(args.strategies)
        peers, notes = split_available([p.strip() for p in args.peers.split(",") if p.strip()])
    except ValueError as error:
        cli.error(str(error))
    dims = _sizes(args.dims, (10**3, 10**4) if args.quick else DIMENSIONS)
    populations = _sizes(args.populations, (16, 64) if args.quick else POPULATIONS)
    elapsed = measure.stopwatch()
    print("## Overhead per generation: esbox against the peers\n")
    print(
        f"Environment: {measure.environment(1)}; "
        f"{measure.versions(['nevergrad', 'cma', 'evosax', 'jax', 'evotorch'])}."
    )
    for note in notes:
        print(f"* {note}")
    print(flush=True)
    cells: dict[tuple[str, int, int], Cell] = {}
    for d in dims:
        for n in populations:
            for m in esbox:
                cells[(m, d, n)] = measure_esbox(m, d, n, args.timeout)
            for p in peers:
                cells[(p, d, n)] = measure_peer(p, d, n, args.timeout, args.max_population_gib,
                                                args.min_seconds)  # fmt: skip
            print(f"measured d = {d:.0e}, N = {n} ({elapsed():.0f} s)", flush=True)
    text, tables = report(cells, [*esbox, *peers], esbox)
    print("\n" + text + "\n")
    written = measure.write_tables(args.csv, tables)
    png = figure(cells, [*esbox, *peers], os.path.join(args.csv, "overhead.png"))
    print(f"Wrote {len(written)} CSV files and {png} ({elapsed():.0f} s in all, load average "
          f"{os.getloadavg()[0]:.1f}).")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
