"""Agent trajectories on the shipped model: peak RSS of ES, GRPO and LoRA-GRPO beside the estimate.

For each trajectory length, four runs, each in a fresh subprocess
(:mod:`benchmarks.agent_memory_children`): plain inference of the trajectories, an ES step over
them (sweep + the same rollout + update), a steady-state full-parameter GRPO step (frozen
reference copy, AdamW) and a LoRA-GRPO step (rank 16 on the attention and MLP matrices). A
trajectory is ``--turns`` turns of ``--reply-tokens`` greedy tokens each, every turn a fresh
``generate`` over the whole conversation (as the agent loop does), with tool results of filler
tokens that bring it to exactly the length asked. Each run's peak RSS above the loaded model is
set beside ``esbox.adapters.models.estimate_memory`` for the same parts, in fp32 on the CPU.

    python -m benchmarks agent-memory --tokens 256,1024

glibc's allocator keeps freed heap blocks, which would hide the live memory: the children run
with ``MALLOC_MMAP_THRESHOLD_=65536`` (``--mmap-threshold 0`` for the default allocator).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import measure
from benchmarks.agent_memory_children import LORA_RANK, METHODS

CHILD_MODULE = "benchmarks.agent_memory_children"
DEFAULT_MODEL = "~/.cache/esbox/models/smollm2-135m-instruct"
CHILD_OPTIONS = ("model", "threads", "tokens", "turns", "reply_tokens", "batch")
NAMES = {"inference": "plain inference", "es": "ES step", "grpo": "GRPO step (full)",
         "lora": f"LoRA-GRPO step (r={LORA_RANK})", "trl_grpo": "TRL GRPOTrainer step (full)",
         "trl_lora": f"TRL GRPOTrainer step (LoRA r={LORA_RANK})"}  # fmt: skip
AS_ESTIMATED = {"trl_grpo": "grpo", "trl_lora": "lora"}  # TRL's steps hold the same parts
# what each run holds above the loaded model (and, for GRPO, its AdamW moments), by the
# estimate's component names; GRPO's rollout KV cache is not resident in a transformers trainer
PARTS = {
    "inference": ("KV cache (rollout)", "prefill workspace (transient)"),
    "es": ("KV cache (rollout)", "prefill workspace (transient)", "ES chunk buffers",
           "exact backup / fp32 master"),
    "grpo": ("gradients", "fp32 master weights", "activations (backprop)", "logits (loss)"),
    "lora": ("LoRA gradients", "activations (backprop)", "logits (loss)"),
}  # fmt: skip
Tables = dict[str, tuple[list[str], list[list[Any]]]]


def estimated_parts(estimate: Any, method: str) -> float:
    """MiB of the components ``PARTS[method]`` in an ``estimate_memory`` result."""
    method = AS_ESTIMATED.get(method, method)
    key = {"inference": "es", "es": "es"}.get(method, method)
    items = estimate.method(key)
    total = sum(items.get(name) for name in PARTS[method] if name != "LoRA gradients")
    if "LoRA gradients" in PARTS[method]:
        total += 4 * estimate.model.lora_parameters(LORA_RANK)  # fp32 gradients of the adapters
    return total / measure.MIB


def resident(estimate: Any, method: str, run: dict[str, Any]) -> float:
    """MiB the run held before its peak counter was reset, by the estimate's sizes: the
    weights, and GRPO's reference copy and AdamW moments (measured), LoRA's adapters."""
    method = AS_ESTIMATED.get(method, method)
    weights = estimate.method("es").get("weights")
    extra = {
        "grpo": estimate.method("grpo").get("reference model (KL)"),
        "lora": 4 * estimate.model.lora_parameters(LORA_RANK),
    }.get(method, 0)
    return (weights + extra) / measure.MIB + run.get("adam", 0.0)


def run_child(method: str, tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    spec = {"kind": method, **{n: getattr(args, n) for n in CHILD_OPTIONS}, "tokens": tokens}
    env = {"MALLOC_MMAP_THRESHOLD_": str(args.mmap_threshold)} if args.mmap_threshold else {}
    elapsed = measure.stopwatch()
    result = measure.run_child(CHILD_MODULE, spec, env=env)
    print(f"  {tokens} tokens, {method}: {elapsed():.0f} s", file=sys.stderr, flush=True)
    return result


def tables(runs: dict[int, dict[str, dict[str, Any]]], estimates: dict[int, Any]) -> Tables:
    """Per run: measured against estimated; per length: whole steps side by side; growth."""
    rows, whole = [], []
    for tokens, by_method in runs.items():
        est = estimates[tokens]
        totals = {}
        for method, run in by_method.items():
            measured, guess = run["peak"] - run["baseline"], estimated_parts(est, method)
            seconds = (run.get("rollout") or run.get("step") or {}).get("seconds", 0.0)
            rows.append([f"{tokens:,}", NAMES[method], f"{run['baseline']:.0f}",
                         f"{run['peak']:.0f}", f"{measured:.0f}", f"{guess:.0f}",
                         f"{measured / guess:.2f}", f"{seconds:.1f}"])  # fmt: skip
            base = resident(est, method, run)
            totals[method] = (base + measured, base + guess)
        cells = [f"{tokens:,}"]
        for method in ("es", "grpo", "lora"):
            if method in totals:
                cells += [f"{totals[method][0]:.0f}", f"{totals[method][1]:.0f}"]
            else:
                cells += ["-", "-"]
        if "es" in totals and "grpo" in totals:
            cells += [f"{totals['grpo'][i] / totals['es'][i]:.2f}" for i in (0, 1)]
        else:
            cells += ["-", "-"]
        whole.append(cells)
    headers = ["trajectory tokens", "run (own subprocess)", "RSS with model (MiB)",
               "peak RSS (MiB)", "measured: peak above the loaded model (MiB)",
               "estimated: the same parts (MiB)", "measured / estimated", "seconds"]  # fmt: skip
    whole_headers = ["trajectory tokens", "ES measured", "ES estimated", "GRPO measured",
                     "GRPO estimated", "LoRA-GRPO measured", "LoRA-GRPO estimated",
                     "GRPO / ES measured", "GRPO / ES estimated"]  # fmt: skip
    return {
        "agent_memory_runs": (headers, rows),
        "agent_memory_steps": (whole_headers, whole),
        "agent_memory_growth": growth(runs, estimates),
        "agent_memory_trl": against_trl(runs),
    }


def against_trl(runs: dict[int, dict[str, dict[str, Any]]]) -> Any:
    """The hand-written GRPO steps beside TRL's GRPOTrainer on the same trajectories: peak above
    the loaded model, measured both ways (rows where both ran)."""
    rows = []
    for tokens, by_method in runs.items():
        for own, trl in (("grpo", "trl_grpo"), ("lora", "trl_lora")):
            if own in by_method and trl in by_method:
                a, b = (by_method[m]["peak"] - by_method[m]["baseline"] for m in (own, trl))
                rows.append([f"{tokens:,}", NAMES[own], f"{a:.0f}", f"{b:.0f}", f"{b / a:.2f}",
                             by_method[trl].get("rows", "-")])  # fmt: skip
    headers = ["trajectory tokens", "step", "hand-written: peak above the model (MiB)",
               "TRL GRPOTrainer: the same (MiB)", "TRL / hand-written", "TRL rows"]  # fmt: skip
    return headers, rows


def growth(runs: dict[int, dict[str, dict[str, Any]]], estimates: dict[int, Any]) -> Any:
    """MiB each method adds per 1,000 trajectory tokens, shortest to longest, both ways."""
    lengths = sorted(runs)
    low, high = lengths[0], lengths[-1]
    rows = []
    for method in METHODS:
        if high == low or method not in runs[low] or method not in runs[high]:
            continue
        measured = [runs[t][method]["peak"] - runs[t][method]["baseline"] for t in (low, high)]
        guess = [estimated_parts(estimates[t], method) for t in (low, high)]
        per_k = 1000 / (high - low)
        m, g = (measured[1] - measured[0]) * per_k, (guess[1] - guess[0]) * per_k
        rows.append([NAMES[method], f"{m:.0f}", f"{g:.0f}", f"{m / g:.2f}" if g else "-"])
    headers = [f"run ({low:,} -> {high:,} tokens)", "measured MiB per 1k tokens",
               "estimated MiB per 1k tokens", "measured / estimated"]  # fmt: skip
    return headers, rows


def report(runs: Any, estimates: Any, args: argparse.Namespace) -> tuple[str, Tables]:
    """The printed report, and its tables by name (for ``--csv``)."""
    tabs = tables(runs, estimates)
    first = next(iter(next(iter(runs.values())).values()))
    allocator = (f"MALLOC_MMAP_THRESHOLD_={args.mmap_threshold}" if args.mmap_threshold
                 else "glibc's default allocator")  # fmt: skip
    lines = [
        f"Trajectories: batch {args.batch} (a member's minibatch for ES, the group for GRPO), "
        f"{args.turns} turns of {args.reply_tokens} generated tokens after a "
        f"{first['layout']['prompt']}-token chat prompt, the rest tool results; fp32 weights, "
        f"{args.threads} thread(s), "
        f"{allocator}; {measure.environment(args.threads)}.",
        "",
        measure.table(*tabs["agent_memory_runs"], align="llrrrrrr"),
        "",
        "Whole step (MiB): the weights, GRPO's reference copy and AdamW moments and LoRA's "
        "adapters by their sizes, the rest as measured above:",
        "",
        measure.table(*tabs["agent_memory_steps"], align="l" + "r" * 8),
        "",
        measure.table(*tabs["agent_memory_growth"], align="lrrr"),
    ]
    if tabs["agent_memory_trl"][1]:
        lines += ["", "The hand-written steps against TRL's own (a group of at least 2, TRL's "
                  "least; no gradient checkpointing on either side):", "",
                  measure.table(*tabs["agent_memory_trl"], align="llrrrr")]  # fmt: skip
    if not all(run["reset"] for by in runs.values() for run in by.values()):
        lines.append("\n> the peak counter could not be reset: peaks include model loading")
    return "\n".join(lines), tabs


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks agent-memory", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="local HF model folder")
    parser.add_argument("--tokens", default="256,1024", help="trajectory lengths, e.g. 256,1k")
    parser.add_argument("--turns", type=int, default=4, help="model turns a trajectory")
    parser.add_argument("--reply-tokens", type=int, default=8, help="generated tokens a turn")
    parser.add_argument("--batch", type=int, default=2, help="trajectories rolled out together")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--methods", default=",".join(METHODS), help="runs, comma-separated")
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=65536,
        help="MALLOC_MMAP_THRESHOLD_ of the children (0: glibc's default)",
    )
    parser.add_argument("--quick", action="store_true", help="128 and 256 tokens, batch 1")
    parser.add_argument("--json", help="also write the raw measurements here")
    parser.add_argument("--csv", metavar="DIR", help="also write each table as DIR/<table>.csv")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    from esbox.adapters.models import estimate_memory
    from esbox.adapters.models.trajectory_memory import parse_token_list

    if args.quick:
        args.tokens, args.batch = "128,256", 1
    try:
        lengths = parse_token_list(args.tokens)
    except ValueError as exc:
        cli.error(f"--tokens: {exc}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or set(methods) - set(METHODS):
        cli.error(f"--methods must name some of {', '.join(METHODS)}")
    if min(args.turns, args.reply_tokens, args.batch, args.threads) < 1:
        cli.error("--turns, --reply-tokens, --batch and --threads must be at least 1")
    model = Path(args.model).expanduser()
    if not (model / "config.json").is_file():
        sys.exit(
            f"no model folder at {args.model}: run esbox convert-model smollm2 or pass --model"
        )
    args.model = str(model.resolve())  # the children run in the repository root
    print("running (each run in its own subprocess)...", file=sys.stderr, flush=True)
    runs = {t: {m: run_child(m, t, args) for m in methods} for t in lengths}
    estimates = {
        t: estimate_memory(args.model, context=t, batch=args.batch, dtype="float32")
        for t in lengths
    }
    text, tabs = report(runs, estimates, args)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({str(t): r for t, r in runs.items()}, indent=1))
    measure.write_tables(args.csv, tabs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
