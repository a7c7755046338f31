"""CPU generation at growing batch sizes: tokens/s, kernel time and page faults, before and after.

On the shipped SmolLM2-135M, each cell in its own subprocess
(:mod:`benchmarks.generation_children`), for batch sizes 1, 8, 16, 64 and 128 (every cell
generates ``--sequences`` rows, or one batch where the batch is larger), single-turn
arithmetic rollouts (32 new tokens a row, EOS ignored) and agent rollouts
(examples/agent-math.yaml's tool-math task, calculator, 2 turns), in the dtypes and thread
counts asked for. Three arms side by side:

* ``reused``: HFBackend as shipped (KV buffers kept across calls, copy-free GQA attention on
  the CPU, glibc keeping freed memory);
* ``before``: ``HFBackend(reuse_memory=False)``: transformers' growing cache and attention,
  glibc's malloc defaults (generation before issue 34);
* ``forward``: one plain batched forward of the same rows and lengths (the limit).

Reported per cell: tokens/s, milliseconds per sequence, user and sys CPU seconds, the sys
share of the CPU time, minor page faults, peak RSS; then the goals: sys share <= 5%, time per
sequence not growing with the batch up to 64, batch 64 >= 1.3x the throughput of batch 8.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import measure
from benchmarks.generation_children import ARMS, WORKLOADS

CHILD_MODULE = "benchmarks.generation_children"
DEFAULT_MODEL = "~/.cache/esbox/models/smollm2-135m-instruct"
Key = tuple[str, str, int, str, int]  # workload, dtype, threads, arm, batch


def _csv(text: str, cast: Any = str) -> list[Any]:
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks generation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="batches 1, 4; 4 rows; 4 tokens")
    parser.add_argument("--batches", default="1,8,16,64,128", help="comma-separated sizes")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated")
    parser.add_argument("--threads", default="1,0", help="comma-separated; 0: every core")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset")
    parser.add_argument("--sequences", type=int, default=16, help="rows a cell at least")
    parser.add_argument("--new-tokens", type=int, default=32, help="arithmetic tokens a row")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="local HF model folder")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child")
    parser.add_argument("--json", help="also write the raw measurements here")
    measure.add_output_option(parser)
    return parser


def measure_all(args: argparse.Namespace) -> dict[Key, dict[str, Any]]:
    """One child per cell; a failed child is recorded with its reason."""
    import os

    cells: dict[Key, dict[str, Any]] = {}
    for workload in args.workloads:
        for dtype in args.dtypes:
            for threads in args.threads:
                for batch in args.batches:
                    for arm in args.arms:
                        spec = {"workload": workload, "dtype": dtype, "arm": arm, "batch": batch,
                                "threads": threads or os.cpu_count() or 1, "model": args.model,
                                "sequences": max(batch, args.sequences),
                                "new_tokens": args.new_tokens}  # fmt: skip
                        key = (workload, dtype, threads, arm, batch)
                        try:
                            cells[key] = measure.run_child(CHILD_MODULE, spec, timeout=args.timeout)
                        except RuntimeError as error:
                            cells[key] = {"skip": str(error).splitlines()[-1][:100]}
                        got = cells[key]
                        print(f"{key}: {got.get('seconds', got.get('skip'))}", file=sys.stderr)
    return cells


def _row(batch: int, arm: str, cell: dict[str, Any]) -> list[Any]:
    if "skip" in cell:
        return [batch, arm, cell["skip"], *["-"] * 7]
    share = cell["sys"] / cell["cpu"] if cell["cpu"] else 0.0
    return [
        batch, arm, f"{cell['tokens'] / cell['seconds']:.0f}",
        f"{1000 * cell['seconds'] / cell['sequences']:.0f}", f"{cell['user']:.1f}",
        f"{cell['sys']:.2f}", f"{100 * share:.1f}%", f"{cell['faults'] / 1e3:,.0f}k",
        f"{cell['peak']:,.0f}",
    ]  # fmt: skip


def goals(cells: dict[Key, dict[str, Any]], group: tuple[str, str, int]) -> str:
    """The issue's three goals for the shipped arm in one (workload, dtype, threads) group."""
    got = {k[4]: c for k, c in cells.items() if k[:3] == group and k[3] == "reused" and "cpu" in c}
    if not got:
        return ""
    worst = max(c["sys"] / c["cpu"] for c in got.values())
    per_seq = {b: c["seconds"] / c["sequences"] for b, c in sorted(got.items()) if b <= 64}
    growing = [b for a, b in itertools.pairwise(per_seq) if per_seq[b] > per_seq[a] * 1.05]
    lines = [f"- sys share at most {100 * worst:.1f}% of the CPU time (goal <= 5%)"]
    lines.append(
        "- time per sequence grows from one batch size to the next (> 5%) at "
        + (", ".join(map(str, growing)) if growing else "no batch size up to 64")
    )
    if 8 in got and 64 in got:
        speed = {b: got[b]["tokens"] / got[b]["seconds"] for b in (8, 64)}
        lines.append(f"- batch 64 / batch 8 throughput: {speed[64] / speed[8]:.2f}x (goal >= 1.3x)")
    return "\n".join(lines)


def report(cells: dict[Key, dict[str, Any]], args: argparse.Namespace) -> tuple[str, Any]:
    headers = ["batch", "arm", "tokens/s", "ms / sequence", "user s", "sys s", "sys share",
               "minor faults", "peak RSS MiB"]  # fmt: skip
    parts, tables = [], {}
    for workload in args.workloads:
        for dtype in args.dtypes:
            for threads in args.threads:
                group = (workload, dtype, threads)
                rows = [_row(b, a, cells[(*group, a, b)]) for b in args.batches
                        for a in args.arms if (*group, a, b) in cells]  # fmt: skip
                shown = "every core" if threads == 0 else f"{threads} thread(s)"
                what = (f"{args.new_tokens} new tokens a row, EOS ignored" if workload ==
                        "arithmetic" else "examples/agent-math.yaml's agent, greedy")  # fmt: skip
                parts += [f"### {workload} rollouts, {dtype}, {shown} ({what})", "",
                          measure.table(headers, rows, "r" * len(headers)), "",
                          goals(cells, group), ""]  # fmt: skip
                tables[f"generation_{workload}_{dtype}_{threads}"] = (headers, rows)
    parts.append(measure.environment())
    return "\n".join(parts), tables


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    args.batches, args.threads = _csv(args.batches, int), _csv(args.threads, int)
    args.workloads, args.dtypes, args.arms = (
        _csv(args.workloads), _csv(args.dtypes), _csv(args.arms)
    )
    for name, chosen, allowed in (("arms", args.arms, ARMS), ("workloads", args.workloads,
                                                            WORKLOADS)):  # fmt: skip
        if unknown := [x for x in chosen if x not in allowed]:
            cli.error(f"unknown {name} {unknown}; choose from {', '.join(allowed)}")
    if args.quick:
        args.batches, args.sequences, args.new_tokens = [1, 4], 4, 4
        args.dtypes, args.threads = args.dtypes[:1], [1]
    model = Path(args.model).expanduser()
    if not (model / "config.json").is_file():
        sys.exit(f"no model folder at {args.model}: run `esbox convert-model smollm2` or --model")
    args.model = str(model.resolve())  # the children run in the repository root
    print("running (each cell in its own subprocess)...", file=sys.stderr, flush=True)
    cells = measure_all(args)
    text, tables = report(cells, args)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"|".join(map(str, k)): c for k, c in cells.items()}))
    measure.write_tables(args.csv, tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
