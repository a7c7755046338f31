"""Low-rank population: an ES step in batched forwards against plain inference and the sweep.

On the shipped SmolLM2-135M, for each population N (default 8, 16, 32) with B = 16 arithmetic
prompts and 32 new tokens a row (EOS ignored, so every row does the same work), each in its
own subprocess (:mod:`benchmarks.lowrank_children`):

* ``inference``: one plain batched ``generate`` of the same N x B rows, no ES;
* ``lowrank``: an OpenAI-ES step with ``perturbation: lowrank`` (rank 4): every member's rows
  in one batched ``generate``, the noise added inside the layers, then tell and the update
  by replay;
* ``fullrank``: the same step with full-rank noise: the sweep writes each member and
  generates its B rows (N calls), then the update.

Reported: wall and CPU seconds of the step, peak RSS (model included, the counter reset after
loading and a warm-up), and the ratios the issue sets goals for: inference / low-rank step
(throughput of the step against plain inference, goal >= 0.8), low-rank / full-rank step
time (goal <= 0.5 at N = 16) and low-rank / inference peak RSS (goal <= 1.2). Read the numbers
as ratios within one run: absolute times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import measure
from benchmarks.lowrank_children import MODES

CHILD_MODULE = "benchmarks.lowrank_children"
DEFAULT_MODEL = "~/.cache/esbox/models/smollm2-135m-instruct"
Cells = dict[tuple[str, int], dict[str, Any]]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks lowrank", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="N = 2, 4, 4 prompts, 4 tokens")
    parser.add_argument("--populations", default="8,16,32", help="comma-separated N values")
    parser.add_argument("--prompts", type=int, default=16, help="B: prompts per step")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per row")
    parser.add_argument("--rank", type=int, default=4, help="rank of the low-rank noise")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="local HF model folder")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads per child")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child")
    parser.add_argument(
        "--learn", type=float, default=0.0,
        help="also run examples/llm-arith.yaml full- and low-rank for this many seconds of "
        "steps each (0: skip)",
    )  # fmt: skip
    parser.add_argument("--learn-seeds", type=int, default=1, help="seeds per learning run")
    parser.add_argument("--learn-heldout", type=int, default=100, help="held-out questions")
    measure.add_jobs_option(parser)
    parser.add_argument("--json", help="also write the raw measurements here")
    measure.add_output_option(parser)
    return parser


def measure_all(args: argparse.Namespace, populations: list[int], modes: list[str]) -> Cells:
    """One child per (mode, N); a failed child is recorded with its reason."""
    cells: Cells = {}
    for n in populations:
        for mode in modes:
            spec = {"kind": mode, "model": args.model, "dtype": args.dtype,
                    "threads": args.threads, "population": n, "prompts": args.prompts,
                    "new_tokens": args.new_tokens, "rank": args.rank}  # fmt: skip
            try:
                cells[(mode, n)] = measure.run_child(CHILD_MODULE, spec, timeout=args.timeout)
            except RuntimeError as error:
                cells[(mode, n)] = {"skip": str(error).splitlines()[-1][:100]}
            got = cells[(mode, n)]
            print(f"N={n} {mode}: {got.get('seconds', got.get('skip'))}", file=sys.stderr)
    return cells


def _ratio(top: float | None, bottom: float | None) -> str:
    return f"{top / bottom:.2f}" if top and bottom else "-"


def _get(cells: Cells, mode: str, n: int, key: str) -> float | None:
    value = cells.get((mode, n), {}).get(key)
    return float(value) if value is not None else None


def report(cells: Cells, args: argparse.Namespace, populations: list[int]) -> tuple[str, Any]:
    """The time and memory table (one row per N) and its CSV form."""
    headers = ["N", "rows N x B", "inference s", "low-rank step s", "full-rank step s",
               "throughput vs inference (wall / CPU)", "low-rank / full-rank (wall / CPU)",
               "peak RSS MiB inference / low-rank / full-rank",
               "low-rank / inference RSS"]  # fmt: skip
    rows = []
    for n in populations:
        wall = {m: _get(cells, m, n, "seconds") for m in MODES}
        cpu = {m: _get(cells, m, n, "cpu") for m in MODES}
        peak = {m: _get(cells, m, n, "peak") for m in MODES}
        shown = {m: f"{wall[m]:.1f}" if wall[m] else cells.get((m, n), {}).get("skip", "-")
                 for m in MODES}  # fmt: skip
        rows.append([
            n, n * args.prompts, shown["inference"], shown["lowrank"], shown["fullrank"],
            f"{_ratio(wall['inference'], wall['lowrank'])} / "
            f"{_ratio(cpu['inference'], cpu['lowrank'])}",
            f"{_ratio(wall['lowrank'], wall['fullrank'])} / "
            f"{_ratio(cpu['lowrank'], cpu['fullrank'])}",
            " / ".join(f"{peak[m]:,.0f}" if peak[m] else "-" for m in MODES),
            _ratio(peak["lowrank"], peak["inference"]),
        ])  # fmt: skip
    title = (f"### One ES step on {Path(args.model).name} ({args.dtype}): B = {args.prompts} "
             f"prompts, {args.new_tokens} new tokens a row, rank {args.rank}, "
             f"{args.threads} thread(s)")  # fmt: skip
    text = "\n".join([title, "", measure.table(headers, rows, "r" * len(headers)), "",
                      measure.environment(args.threads)])  # fmt: skip
    return text, {"lowrank": (headers, rows)}


def learning(args: argparse.Namespace) -> tuple[str, Any, dict[str, Any]]:
    """Held-out accuracy of the arithmetic config at equal step seconds, full against low rank."""
    specs = {
        f"{mode} seed {seed}": {
            "kind": "learn", "perturbation": mode, "rank": args.rank, "seed": seed,
            "seconds": args.learn, "every": 3, "heldout": args.learn_heldout,
            "threads": args.threads, "out": str(Path(args.csv).resolve() / f"learn-{mode}-{seed}"),
        }
        for seed in range(args.learn_seeds)
        for mode in ("full", "lowrank")
    }  # fmt: skip
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each child is its own process
        futures = {
            name: pool.submit(measure.run_child, CHILD_MODULE, spec, timeout=args.learn * 3 + 1200)
            for name, spec in specs.items()
        }
        runs: dict[str, Any] = {name: future.result() for name, future in futures.items()}
    rows = []
    for name, run in runs.items():
        spec, curve = specs[name], run["curve"]
        rows.append([spec["perturbation"], spec["seed"], run["steps"], f"{curve[0][1]:.3f}",
                     f"{curve[-1][1]:.3f}", f"{curve[-1][0]:.0f}"])  # fmt: skip
        print(f"learn {name}: {curve}", file=sys.stderr, flush=True)
    headers = ["perturbation", "seed", "steps", "held-out accuracy before", "after",
               "step seconds at the last check"]  # fmt: skip
    text = "\n".join([
        f"### Arithmetic (examples/llm-arith.yaml, CoPES K = 4, N = 16), {args.learn:.0f} s of "
        f"steps a run, {args.learn_heldout} held-out questions", "",
        measure.table(headers, rows),
    ])  # fmt: skip
    return text, {"lowrank_learning": (headers, rows)}, runs


def learning_figure(runs: dict[str, Any], path: str) -> Any:
    """Held-out accuracy against step seconds, one line per run."""
    from benchmarks import plots

    series = {name: ([p[0] for p in run["curve"]], [p[1] for p in run["curve"]], None, None)
              for name, run in runs.items()}  # fmt: skip
    return plots.save_panels(path, {"arithmetic, held-out accuracy": series},
                             xlabel="seconds of ES steps", ylabel="accuracy")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    populations = [int(x) for x in args.populations.split(",") if x.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        cli.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    if args.quick:
        populations, args.prompts, args.new_tokens = [2, 4], 4, 4
    model = Path(args.model).expanduser()
    if not (model / "config.json").is_file():
        sys.exit(f"no model folder at {args.model}: run `esbox convert-model smollm2` or --model")
    args.model = str(model.resolve())  # the children run in the repository root
    print("running (each measurement in its own subprocess)...", file=sys.stderr, flush=True)
    cells = measure_all(args, populations, modes)
    text, tables = report(cells, args, populations)
    raw: dict[str, Any] = {f"{mode} N={n}": cell for (mode, n), cell in cells.items()}
    if args.learn:
        more, found, runs = learning(args)
        text, raw["learning"] = f"{text}\n\n{more}", runs
        tables.update(found)
        learning_figure(runs, str(Path(args.csv) / "lowrank_learning.png"))
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    measure.write_tables(args.csv, tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
