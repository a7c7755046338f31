"""LLM overhead of ES on the shipped model: sweep time a member, peak RSS against backprop.

The sweep's own time against the rollouts it brackets, and peak RSS of an ES step against
plain inference and one backprop step.

1. Time: a steady-state ES step per variant (openai_es and copes K=4, each with and without
   ``reflect_antithetic``): every member's rollout (16 ArithmeticTask prompts x 32 new tokens,
   greedy, HFBackend, no stop string) inside one ``space.sweep``, the sweep's own work
   (backup, writing each member, one restore) timed apart from the rollouts, then the update.
   A first step with 2-token rollouts comes before it and is reported apart: it allocates
   the reused buffers and the noise table, once a run. Also one call of each space
   operation on the whole model. Target: at most 5% a member.
2. Memory: peak RSS of an ES step (sweep + rollouts + apply of the update), of the same rollout
   without ES, and of one forward+backward+AdamW step on the same prompts plus 32 tokens. Each
   runs in its own subprocess (:mod:`benchmarks.llm_children`); the peak counter is reset
   after the model is loaded. Targets: ES <= 1.1x inference (host backup reported
   separately), <= 1/4 backprop.

    python -m benchmarks llm --noise generator     # or --noise table

Read the numbers as ratios within one run: absolute times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import measure
from benchmarks.llm_children import MEMORY_RUNS, STRATEGIES

CHILD_MODULE = "benchmarks.llm_children"
DEFAULT_MODEL = "~/.cache/esbox/models/smollm2-135m-instruct"
DEFAULT_CHUNK_SIZE = 1 << 20  # esbox.adapters.models.space.MODEL_CHUNK_SIZE (children import it)
DEFAULT_TABLE_SIZE = 1 << 25  # esbox.noise.DEFAULT_TABLE_SIZE
CHILD_OPTIONS = (
    "model",
    "threads",
    "prompts",
    "new_tokens",
    "population",
    "noise",
    "chunk_size",
    "table_size",
    "dtype",
)
Tables = dict[str, tuple[list[str], list[list[Any]]]]


def run_child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement (``timing`` or one of ``MEMORY_RUNS``) in a fresh interpreter."""
    spec = {"kind": mode, **{name: getattr(args, name) for name in CHILD_OPTIONS}}
    elapsed = measure.stopwatch()
    result = measure.run_child(CHILD_MODULE, spec)
    print(f"  {mode}: {elapsed():.0f} s", file=sys.stderr, flush=True)
    return result


def measure_memory(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every memory run ``args.repeats`` times, interleaved so drift hits all alike; each keeps
    the run with its median peak, plus every run's peak (the backprop peak varies by ~10%)."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MEMORY_RUNS}
    for _ in range(args.repeats):
        for mode in MEMORY_RUNS:
            runs[mode].append(run_child(mode, args))
    memory = {}
    for mode, results in runs.items():
        results.sort(key=lambda m: m["peak"])
        memory[mode] = {**results[len(results) // 2], "peaks": [m["peak"] for m in results]}
    return memory


def met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def timing_tables(timing: dict[str, Any]) -> Tables:
    """The ES step per variant, and the profile of the space's operations."""
    rows = []
    for label, v in timing["variants"].items():
        roll = statistics.mean(r["wall"] for r in v["rollouts"])
        cost = v["overhead"] / v["members"]
        rows.append(
            [
                f"{label} (N={v['members']})",
                f"{roll:.2f} s",
                f"{cost:.3f} s",
                f"{cost / roll:.1%}",
                met(cost / roll <= 0.05),
                f"{v['first_overhead'] / v['members']:.3f} s",
                f"{v['apply']:.2f} s ({v['terms']})",
            ]
        )
    headers = [
        "variant",
        "rollout a member (mean)",
        "sweep overhead a member",
        "fraction of the rollout",
        "target <= 5%",
        "first step's overhead a member",
        "apply the update (terms)",
    ]
    profile = timing["profile"]
    operations = dict.fromkeys(op for p in profile.values() for op in p)
    op_rows = [
        [op, *(f"{p[op]:.3f}" if op in p else "-" for p in profile.values())] for op in operations
    ]
    return {
        "llm_timing": (headers, rows),
        "llm_operations": (["operation", *profile], op_rows),
    }


def memory_tables(memory: dict[str, dict[str, Any]], args: argparse.Namespace) -> Tables:
    """Peak RSS of each run, and the ratios against their targets."""
    inf, bp = memory["inference"], memory["backprop"]

    def row(label: str, m: dict[str, Any], notes: str) -> list[str]:
        spread = f" ({min(m['peaks']):.0f}-{max(m['peaks']):.0f})" if len(m["peaks"]) > 1 else ""
        return [
            label,
            f"{m['runtime']:.0f} MiB",
            f"{m['baseline']:.0f} MiB",
            f"{m['peak']:.0f} MiB{spread}",
            f"{m['peak'] - m['baseline']:.0f} MiB",
            notes,
        ]

    rows = [row("plain inference", inf, "the same rollout, no ES")]
    es_rows = [memory[f"es_{name}"] for name, _ in STRATEGIES]
    for (name, _), m in zip(STRATEGIES, es_rows, strict=True):
        notes = (
            f"host backup {m['backup']:.0f} MiB (RSS rose {m['backup_measured']:.0f} MiB on "
            f"entering the sweep), label pattern {m['labels']:.2f} MiB, {m['terms']} update terms"
        )
        rows.append(row(f"ES step, {name}", m, notes))
    recipe = ", fp32 weights and AdamW, bf16 autocast" if args.dtype == "bfloat16" else ""
    rows.append(
        row("backprop step (AdamW)", bp, f"{bp['tokens']} tokens, {bp['seconds']:.1f} s{recipe}")
    )
    headers = [
        "run (own subprocess)",
        "runtime RSS (no model)",
        "RSS with model",
        "peak RSS",
        "peak - RSS with model",
        "notes",
    ]
    ratios = [
        ("ES peak / inference peak", lambda m: m["peak"] / inf["peak"], 1.1),
        ("(ES peak - host backup) / inference peak",
         lambda m: (m["peak"] - m["backup"]) / inf["peak"], 1.1),
        ("ES peak / backprop peak", lambda m: m["peak"] / bp["peak"], 0.25),
        ("(ES peak - host backup) / backprop peak",
         lambda m: (m["peak"] - m["backup"]) / bp["peak"], 0.25),
        ("same, worst pairing: (largest ES peak - backup) / smallest backprop peak",
         lambda m: (max(m["peaks"]) - m["backup"]) / min(bp["peaks"]), 0.25),
        ("floor: plain inference peak / backprop peak (no ES)",
         lambda m: inf["peak"] / bp["peak"], None),
        ("same, without the runtime RSS: (ES - runtime) / (backprop - runtime)",
         lambda m: (m["peak"] - m["runtime"]) / (bp["peak"] - bp["runtime"]), None),
        ("(ES - runtime - backup) / (backprop - runtime)",
         lambda m: (m["peak"] - m["runtime"] - m["backup"]) / (bp["peak"] - bp["runtime"]), None),
    ]  # fmt: skip
    ratio_rows = []
    for label, fn, bound in ratios:
        vals = [fn(m) for m in es_rows]
        text = f"<= {bound}" if bound else "(context)"
        verdict = ", ".join(met(v <= bound) for v in vals) if bound else "-"
        ratio_rows.append([label, *(f"{v:.2f}" for v in vals), text, verdict])
    return {
        "llm_memory": (headers, rows),
        "llm_ratios": (["ratio", "openai_es", "copes K=4", "target", "met"], ratio_rows),
    }


def report(
    timing: dict[str, Any], memory: dict[str, dict[str, Any]], args: argparse.Namespace
) -> tuple[str, Tables]:
    """The printed report, and its tables by name (for ``--csv``)."""
    tables = {**timing_tables(timing), **memory_tables(memory, args)}
    first = next(iter(timing["variants"].values()))["rollouts"]
    ops = len(timing["profile"])
    lines = [
        f"Noise: {args.noise}"
        + (f" ({args.table_size:,} fp32 normals)" if args.noise == "table" else "")
        + f", chunks of {args.chunk_size} elements. Rollout: {args.prompts} "
        f"prompts x max {args.new_tokens} new tokens, greedy, no stop string; "
        f"{first[0]['forwards']} forward passes each; tokens before EOS: "
        f"{min(r['new_tokens'] for r in first):.0f}-{max(r['new_tokens'] for r in first):.0f} "
        f"a rollout. d = {timing['dimension']:,} {args.dtype} weights, {args.threads} threads, "
        f"load average at the end {timing['loadavg'][0]:.1f}.",
        "",
        measure.table(*tables["llm_timing"], align="lrrrlrr"),
        "",
        "The space's operations on the whole model, one call each (wall s):",
        "",
        measure.table(*tables["llm_operations"], align="l" + "r" * ops),
        "",
        f"Memory: each run {args.repeats} times in a fresh subprocess, interleaved; the median "
        "peak, with the range of all runs in brackets.",
        "",
        measure.table(*tables["llm_memory"], align="lrrrrl"),
        "",
        measure.table(*tables["llm_ratios"], align="lrrll"),
    ]
    if not all(memory[k]["reset"] for k in memory):
        lines.append("\n> the peak counter could not be reset: peaks include model loading")
    return "\n".join(lines), tables


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks llm", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="local HF model folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 8 tokens, N = 8")
    parser.add_argument(
        "--noise",
        choices=("generator", "table"),
        default="generator",
        help="the space's noise mode (table: windows of a shared noise table)",
    )
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument(
        "--table-size", type=int, default=DEFAULT_TABLE_SIZE, help="normals in the noise table"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="weights of inference and ES (bfloat16: ES keeps an fp32 master on the host); "
        "backprop then runs the mixed-precision recipe (fp32 weights and AdamW, bf16 autocast)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each memory measurement (median kept)"
    )
    parser.add_argument("--json", help="also write the raw measurements here")
    parser.add_argument("--csv", metavar="DIR", help="also write each table as DIR/llm_<table>.csv")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.repeats < 1:
        cli.error("--repeats must be at least 1")
    if args.quick:
        args.prompts, args.new_tokens, args.population = 4, 8, 8
    model = Path(args.model).expanduser()
    if not (model / "config.json").is_file():
        sys.exit(f"no model folder at {args.model}: run the esbox conversion or pass --model")
    args.model = str(model.resolve())  # the children run in the repository root
    print("running (each part in its own subprocess)...", file=sys.stderr, flush=True)
    timing = run_child("timing", args)
    memory = measure_memory(args)
    text, tables = report(timing, memory, args)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"timing": timing, "memory": memory}, indent=1))
    measure.write_tables(args.csv, tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
