"""Scale-out on Ray: one process on one core against 2 Ray workers with one core each.

On the LLM arithmetic task (``examples/llm-arith.yaml``, SmolLM2-135M, without the held-out
validation) and on a cheap function (``examples/rastrigin-copes.yaml``, d = 100, N = 64), each
in its own subprocess (:mod:`benchmarks.scale_children`): seconds per step after a warm-up
step, the per-core efficiency ``(steps/s with W workers) / (W x steps/s of one process on one
core)``, the CPU seconds each process spends a step (the pool's extra work, whatever the
machine's load), the bytes the pool's calls carry per step against one copy of the weights,
and the seconds to replace a worker SIGKILLed during a step. Both runs then end on the same
step: the last column says whether their parameters are bit-identical.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from benchmarks import measure
from benchmarks.scale_children import TASKS

HEADERS = ["task", "1 process, 1 core: s / step", "workers", "workers: s / step",
           "per-core efficiency", "CPU time efficiency", "wire / step", "calls / step",
           "one copy of the weights", "replacing a killed worker s", "bit-identical"]  # fmt: skip
PROFILE_HEADERS = ["task", "run", "start s", "step s", "evaluate s", "rest of the step s",
                   "CPU s a step: driver + workers", "cores busy", "waiting for a core s",
                   "step with a kill s", "load average"]  # fmt: skip
CHILD = "benchmarks.scale_children"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a few steps (a smoke run)")
    parser.add_argument(
        "--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}"
    )
    parser.add_argument("--workers", type=int, default=2, help="Ray workers (default 2)")
    parser.add_argument(
        "--no-driver-replica",
        dest="driver_replica",
        action="store_false",
        help="scale.driver_replica: false (the driver keeps no replica and applies no update)",
    )
    parser.add_argument(
        "--llm-steps", type=int, default=None, help="timed LLM steps (default 3; --quick 1)"
    )
    parser.add_argument(
        "--function-steps",
        type=int,
        default=None,
        help="timed function steps (default 200; --quick 20)",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds one run may take (default 1800)"
    )
    measure.add_output_option(parser)
    return parser


def measure_task(
    task: str, workers: int, steps: int, timeout: float, driver_replica: bool
) -> dict[str, Any]:
    """The task in one process on one core, then on ``workers`` Ray workers; either result
    is ``{"failed": reason}`` when its child failed."""
    runs: dict[str, Any] = {}
    for name, count in (("single", 0), ("pool", workers)):
        spec = {"task": task, "workers": count, "warmup": 1, "steps": steps,
                "driver_replica": driver_replica}  # fmt: skip
        try:
            runs[name] = measure.run_child(CHILD, spec, timeout=timeout)
        except RuntimeError as error:
            lines = [line for line in str(error).splitlines() if line.strip()]
            runs[name] = {"failed": lines[-1][:100]}
        runs[name]["load"] = os.getloadavg()[0]
        print(f"measured {task}, {count or 'no'} worker(s)", flush=True)
    return runs


def size(count: float) -> str:
    """Bytes in decimal units: ``740 B``, ``3.1 kB``, ``538 MB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:.0f} B"


def row(task: str, workers: int, runs: dict[str, Any]) -> list[Any]:
    """One row of the main table (a dash where a run failed)."""
    single, pool = runs["single"], runs["pool"]
    if "failed" in single or "failed" in pool:
        reason = single.get("failed") or pool.get("failed")
        return [task, *["-"] * (len(HEADERS) - 2), f"failed: {reason}"]
    traffic = pool["traffic"]
    wire = traffic["sent"] + traffic["received"]
    (replaced,) = pool["replacements"]
    efficiency = single["seconds"] / (workers * pool["seconds"])
    work = sum(single["cpu_seconds"]) / sum(pool["cpu_seconds"])
    return [task, f"{single['seconds']:.3g}", workers, f"{pool['seconds']:.3g}",
            f"{efficiency:.2f}", f"{work:.2f}", size(wire), f"{traffic['calls']:.1f}",
            size(single["weights_bytes"]), f"{replaced['seconds']:.2f}",
            "yes" if single["checksum"] == pool["checksum"] else "NO"]  # fmt: skip


def profile_rows(task: str, runs: dict[str, Any]) -> list[list[Any]]:
    """Where a step's time goes, in each run."""
    rows = []
    for name, run in runs.items():
        if "failed" in run:
            continue
        rest = run["seconds"] - run["evaluate_seconds"]
        label = "1 process, 1 core" if name == "single" else "workers"
        cpu = run["cpu_seconds"]
        parts = " + ".join(f"{c:.3g}" for c in cpu)
        rows.append([task, label, f"{run['start_seconds']:.1f}", f"{run['seconds']:.3g}",
                     f"{run['evaluate_seconds']:.3g}", f"{rest:.3g}", parts,
                     f"{sum(cpu) / run['seconds']:.2f}", f"{sum(run['wait_seconds']):.3g}",
                     f"{run['last_step_seconds']:.3g}", f"{run['load']:.1f}"])  # fmt: skip
    return rows


def replacement_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """How each killed worker was replaced: how it caught up and what it received."""
    lines = []
    for task, runs in results.items():
        for r in runs["pool"].get("replacements", []):
            lines.append(f"* {task}: worker {r['actor']} died while {r['during']}; its "
                         f"replacement caught up by {r['method']}, receiving "
                         f"{size(r['received_bytes'])}, ready {r['seconds']:.2f} s after the "
                         "death was seen.")  # fmt: skip
    return lines


def report(
    results: dict[str, dict[str, Any]], workers: int
) -> tuple[str, dict[str, tuple[list[str], list[list[Any]]]]]:
    """The main table, the profile table and the replacement lines; the CSV tables."""
    rows = [row(task, workers, runs) for task, runs in results.items()]
    profile = [r for task, runs in results.items() for r in profile_rows(task, runs)]
    text = "\n".join([
        measure.table(HEADERS, rows, align="lrrrrrrrrrl"), "",
        "CPU time efficiency: the CPU seconds of a step in one process over those of the "
        "driver and all workers together (1.0: the pool adds no work; unlike the per-core "
        "efficiency it does not depend on how much of the cores other jobs take).", "",
        "Where the time of a step goes (evaluate: scoring the population; the rest: ask, tell "
        "and applying the update on every replica), the CPU seconds each process used a step, "
        "the cores they kept busy (CPU seconds over wall seconds) and the seconds their threads "
        "were ready to run but waited for a core (other jobs on the machine), a step:", "",
        measure.table(PROFILE_HEADERS, profile, align="llrrrrrrrrr"), "",
        *replacement_lines(results),
    ])  # fmt: skip
    return text, {"scale": (HEADERS, rows), "scale_profile": (PROFILE_HEADERS, profile)}


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        cli.error(f"unknown tasks {unknown}; known: {', '.join(TASKS)}")
    if args.workers < 1:
        cli.error("--workers must be >= 1")
    steps = {
        "llm": args.llm_steps or (1 if args.quick else 3),
        "rastrigin": args.function_steps or (20 if args.quick else 200),
    }
    elapsed = measure.stopwatch()
    print("## Scale-out on Ray: one process on one core against Ray workers with one each\n")
    print(f"Environment: {measure.environment(1)}; {measure.versions(['ray'])}.", flush=True)
    print(f"The driver keeps a replica: {'yes' if args.driver_replica else 'no'}.", flush=True)
    results = {
        t: measure_task(t, args.workers, steps[t], args.timeout, args.driver_replica)
        for t in tasks
    }
    text, tables = report(results, args.workers)
    print("\n" + text + "\n")
    written = measure.write_tables(args.csv, tables)
    print(f"Wrote {len(written)} CSV files ({elapsed():.0f} s in all, load average "
          f"{os.getloadavg()[0]:.1f}).")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
