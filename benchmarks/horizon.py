"""ES against GRPO as the horizon grows: CoPES and GRPO at equal CPU time on the chain task
(h dependent calculator calls) and on Sudoku (h empty cells, one move each), held-out episode
success and peak memory against h, and each method's gain over the base model against h.

Each horizon is one task of :mod:`benchmarks.rl`, run by its protocol (tuning on validation
episodes, ``--seeds`` final runs at the same CPU budget, greedy held-out success with paired
errors against the base): this suite writes the ES and GRPO configs of every horizon — the
chain task from ``examples/agent-math.yaml``'s settings with ``kind: tool_chain``, Sudoku from
``examples/agent-sudoku.yaml`` with ``clues = 81 - h`` — runs the rl suite on them, and
reports its results against h. The turn and token limits grow with h (``h + 1`` turns).
``--quick`` is a smoke run on a tiny random model (no result).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from benchmarks import measure

FAMILIES = {"chain": "examples/agent-math.yaml", "sudoku": "examples/agent-sudoku.yaml"}
GRPO = {"num_generations": 4, "learning_rate": 1.0e-6, "gradient_accumulation_steps": 4}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks horizon", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--chain", default="1,2,4", help="chain horizons ('' for none)")
    parser.add_argument("--sudoku", default="2,4,8", help="Sudoku empty cells ('' for none)")
    parser.add_argument(
        "--cpu-minutes", type=float, default=5.0, help="budget of a run, in minutes of --clock"
    )
    parser.add_argument("--seeds", type=int, default=2, help="final runs a method")
    parser.add_argument("--tuning", type=int, default=1, help="tuning runs a method (1-3)")
    parser.add_argument("--validation", type=int, default=20, help="validation episodes")
    parser.add_argument("--heldout", type=int, default=50, help="held-out test episodes")
    parser.add_argument("--samples", type=int, default=2, help="sampled rollouts for pass@k")
    parser.add_argument("--model", default=None, help="local HF model folder (default: shipped)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per process")
    for side in ("es", "grpo"):
        parser.add_argument(
            f"--{side}-set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"one more --set for the {side.upper()} runs (repeatable), passed to the rl suite",
        )
    parser.add_argument("--quick", action="store_true", help="tiny model, tiny sizes: a smoke run")
    measure.add_clock_option(parser)
    measure.add_jobs_option(parser)
    measure.add_output_option(parser)
    return parser


def horizons(text: str) -> list[int]:
    return [int(h) for h in text.split(",") if h.strip()]


def configs(family: str, h: int, quick_model: Path | None) -> tuple[dict, dict]:
    """The ES and GRPO configs of one horizon (the same problem: the rl suite checks it)."""
    es = yaml.safe_load((measure.ROOT / FAMILIES[family]).read_text())
    problem = es["problem"]
    agent = dict(problem["agent"])
    if family == "chain":
        problem["task"] = {**problem["task"], "kind": "tool_chain", "horizon": h}
        problem["task"].pop("families", None)
        problem["task"]["system"] = CHAIN_SYSTEM
        agent.pop("prefill", None)
        agent.update(max_turns=h + 1, max_tokens=40 * (h + 1), max_new_tokens=40)
    else:
        problem["task"] = {**problem["task"], "kwargs": {"clues": 81 - h, "max_turns": h + 1}}
        agent.update(max_turns=h + 1, max_tokens=16 * (h + 1))
    problem["agent"] = agent
    problem["validation_every"] = 0
    if quick_model is not None:
        problem.update(model=str(quick_model), dtype="float32", batch_size=2, threads=1,
                       table_size=65536, chunk_size=65536)  # fmt: skip
        problem["task"].update(train_size=16, heldout_size=8)
        agent.update(max_turns=min(agent["max_turns"], 3), max_tokens=24, max_new_tokens=8)
        es["options"].update(population=4, subspaces=2)
    es.pop("grpo", None)
    es["output"] = {"dir": f"runs/horizon-{family}-{h}"}
    grpo = {key: value for key, value in es.items() if key not in ("strategy", "options")}
    small = {
        "num_generations": 2,
        "gradient_accumulation_steps": 1,
        "gradient_checkpointing": False,
    }
    grpo["grpo"] = dict(GRPO, **(small if quick_model else {}))
    return es, grpo


CHAIN_SYSTEM = """You are a careful assistant with a calculator. Example:
User: Start with 12. Step 1: multiply by 34. Step 2: add 5. What is the final number?
Assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>
Tool: 408
Assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "408 + 5"}}</tool_call>
Tool: 413
Assistant: <answer>413</answer>"""


def paired(base: list[int], runs: list[list[int]]) -> tuple[float, float, float]:
    """Success (mean over seeds), gain over the base and its paired SE (question by question,
    all seeds' differences pooled)."""
    diffs = [g - b for run in runs for g, b in zip(run, base, strict=True)]
    success = statistics.fmean(statistics.fmean(run) for run in runs)
    gain = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return success, gain, se


def summarize(raw: dict[str, Any], tasks: list[tuple[str, int, str]]) -> list[list[Any]]:
    """One row per (family, h, method): held-out success, gain ± paired SE, peak RSS."""
    rows = []
    for family, h, name in tasks:
        result = raw[name]
        base = result["base"]["greedy"]
        rows.append([family, h, "base", f"{statistics.fmean(base):.3f}", "", ""])
        for method in ("copes", "grpo"):
            finals = [r for r in result["runs"] if r["method"] == method and "test" in r]
            if not finals:
                continue
            success, gain, se = paired(base, [r["test"]["greedy"] for r in finals])
            peak = max(r.get("peak_rss_mib") or 0.0 for r in finals)
            rows.append([family, h, method, f"{success:.3f}", f"{gain:+.3f} ± {se:.3f}",
                         f"{peak:.0f}"])  # fmt: skip
    return rows


def figure(rows: list[list[Any]], folder: Path) -> Path:
    """Each method's gain over the base against h, one panel a family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({r[0] for r in rows})
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 3.5), squeeze=False)
    for ax, family in zip(axes[0], families, strict=True):
        for method in ("copes", "grpo"):
            points = [(r[1], r[4]) for r in rows if r[0] == family and r[2] == method]
            if not points:
                continue
            hs = [p[0] for p in points]
            gains = [float(p[1].split(" ± ")[0]) for p in points]
            ses = [float(p[1].split(" ± ")[1]) for p in points]
            ax.errorbar(hs, gains, yerr=[0 if math.isnan(s) else s for s in ses], marker="o",
                        capsize=3, label=method)  # fmt: skip
        ax.axhline(0.0, color="grey", linewidth=0.5)
        ax.set(title=family, xlabel="horizon h", ylabel="held-out success gain over base")
        ax.legend()
    path = folder / "horizon_gain.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    from benchmarks import rl

    args = parser().parse_args(argv)
    out = Path(args.csv).resolve()
    folder = out / ("horizon-quick" if args.quick else "horizon")
    folder.mkdir(parents=True, exist_ok=True)
    quick_model = None
    if args.quick:
        from esbox.adapters.models.testing import save_tiny_lm

        quick_model = save_tiny_lm(folder / "tiny-lm", max_position_embeddings=4096)
        args.chain, args.sudoku = "1,2", "2"
        args.cpu_minutes, args.validation, args.heldout, args.samples = 0.05, 2, 4, 2
    tasks = [(f, h, f"{f}-h{h}") for f in FAMILIES for h in horizons(getattr(args, f))]
    pairs = []
    for family, h, name in tasks:
        es, grpo = configs(family, h, quick_model)
        for kind, config in (("es", es), ("grpo", grpo)):
            (folder / f"{name}-{kind}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        pairs += ["--config", f"{name}={folder / f'{name}-es.yaml'},{folder / f'{name}-grpo.yaml'}"]
    raw_path = folder / "rl.json"
    code = rl.main([
        "--tasks", ",".join(name for *_, name in tasks), *pairs, "--methods", "copes,grpo",
        "--cpu-minutes", str(args.cpu_minutes), "--tuning", str(args.tuning),
        "--seeds", str(args.seeds), "--validation", str(args.validation),
        "--heldout", str(args.heldout), "--samples", str(args.samples),
        "--timeout", str(args.timeout), "--jobs", str(args.jobs), "--csv", str(folder),
        "--json", str(raw_path), "--clock", args.clock,
        *(["--model", args.model] if args.model else []),
        *(flag for item in args.es_set for flag in ("--es-set", item)),
        *(flag for item in args.grpo_set for flag in ("--grpo-set", item)),
    ])  # fmt: skip
    if code:
        return code
    rows = summarize(json.loads(raw_path.read_text()), tasks)
    headers = ["family", "h", "method", "held-out success", "gain (paired SE)", "peak RSS MiB"]
    measure.write_tables(folder, {"horizon": (headers, rows)})
    print("\n" + measure.table(headers, rows, "llllrr"))
    print(f"\n![gain against the horizon]({figure(rows, folder)})\n")
    if args.quick or args.seeds < 2:
        print("(a smoke run: not a result)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
