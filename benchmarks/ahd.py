"""Co-evolution on AHD: parameters only, contexts only and both (strategy esopt) at the same CPU
budget, on bin-packing and TSP settings (task x instance size x seed), held-out reward paired
example by example; "both improves its matched baseline in N of M settings".

The protocol, the same for every arm of a setting:

* **The settings.** Each task of ``--binpacking`` (``n_items``) and ``--tsp`` (``n_cities``)
  sizes, with each of the ``--seeds`` seeds (0, 1, ...: the run seed and the instance seed),
  from ``examples/ahd-binpacking.yaml``'s settings (SmolLM2-135M, population 8, 4 examples a
  step). The default is 2 x 2 x 2 = 8 settings.
* **The arms**, each started from the same weights and the same skill text (:data:`SKILL`):
  ``parameters`` (ESOpt's weight update, the skill text fixed: the matched baseline);
  ``contexts`` (the weight update off, ``options.learning_rate: 0``: members are still perturbed
  and score the contexts, so a step costs what it costs in ``both``; the proposer rewrites the
  skill text from the step's best codes and rewards, ``problem.proposer_evidence``); ``both``
  (the update and the proposer). The two contexts of ``contexts`` and ``both`` start as the
  skill text twice (the best is kept, the worst replaced).
* **The budget.** Every run is the real CLI (``esbox optimize``) in its own process, stopped at
  ``--cpu-minutes`` of its own CPU clock (``budget.max_cpu_seconds``; one torch thread; the
  proposer's generations count, the sandboxed code's child processes do not), with no
  validation inside the run.
* **The test.** Each final model, read after its best context (``best_context.txt``), and the
  start model with the skill text (``base``) write one greedy reply an example on the
  ``--heldout`` held-out examples, whose instances no run trained on, scored in the sandbox
  (:mod:`benchmarks.ahd_children`). Per setting: each model's mean reward and SE, the paired
  difference of ``both`` against each other model with its paired SE, examples won and lost,
  errors, CPU seconds and steps; then the N of M line.

``--quick`` runs the protocol on one setting (bin packing, 10 items) with a tiny random model:
it tests the plumbing and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks import measure
from benchmarks.horizon import paired
from benchmarks.rl_report import mean_se

CHILD_MODULE = "benchmarks.ahd_children"
CONFIG = "examples/ahd-binpacking.yaml"
SKILL = (
    "Write one short, valid Python function with exactly the signature asked for, using only "
    "the standard library. Keep what makes the reference work and change one idea at a time."
)
SIZE_KEYS = {"ahd_binpacking": "n_items", "ahd_tsp": "n_cities"}
ARMS = ("parameters", "contexts", "both")
BASELINE = "parameters"  # the matched baseline of "both"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks ahd", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--binpacking", default="50,100", help="n_items sizes ('' for none)")
    parser.add_argument("--tsp", default="20,30", help="n_cities sizes ('' for none)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds a task and size (0, 1, ...)")
    parser.add_argument(
        "--cpu-minutes", type=float, default=10.0, help="budget of a run, in minutes of --clock"
    )
    parser.add_argument("--heldout", type=int, default=16, help="held-out examples scored")
    parser.add_argument("--evidence", type=int, default=2, help="best codes shown the proposer")
    parser.add_argument("--model", default=None, help="local HF model folder (default: shipped)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per process")
    parser.add_argument("--runs", default=None, help="run directories go here (default: --out)")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more --set for every run (repeatable), e.g. problem.backend=vllm",
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, tiny sizes: a smoke run")
    measure.add_clock_option(parser)
    measure.add_jobs_option(parser)
    measure.add_output_option(parser)
    parser.set_defaults(extra_values={}, task_values={})  # --quick's smaller runs
    return parser


@dataclass
class Setting:
    """One task, instance size and seed: its three runs and, once scored, its models."""

    task: str
    size: int
    seed: int
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # arm: steps, CPU s, stop
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # model: rewards, errors

    @property
    def name(self) -> str:
        return f"{self.task.removeprefix('ahd_')}-{self.size}-seed{self.seed}"


def settings(args: argparse.Namespace) -> list[Setting]:
    """Every (task, size, seed) of the options, in that order."""
    sizes = {"ahd_binpacking": args.binpacking, "ahd_tsp": args.tsp}
    return [
        Setting(task, int(size), seed)
        for task, text in sizes.items()
        for size in text.split(",")
        if size.strip()
        for seed in range(args.seeds)
    ]


def arm_values(arm: str, evidence: int) -> dict[str, Any]:
    """The config overrides that make an arm (see the module docstring)."""
    if arm == "parameters":
        return {"options.contexts": [SKILL], "problem.context_proposer": "none"}
    values = {
        "options.contexts": [SKILL, SKILL],
        "problem.context_proposer": "model",
        "problem.proposer_evidence": evidence,
    }
    if arm == "contexts":
        values["options.learning_rate"] = 0.0
    return values


def run_values(setting: Setting, arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """All overrides of one run: the setting's task and seed, the arm, the equal CPU budget."""
    config = yaml.safe_load((measure.ROOT / CONFIG).read_text())
    task = dict(config["problem"]["task"], kind=setting.task, seed=setting.seed)
    if setting.task != "ahd_binpacking":
        task.pop("n_items"), task.pop("capacity")
    task.update({SIZE_KEYS[setting.task]: setting.size, "heldout_size": args.heldout})
    task.update(args.task_values)
    values: dict[str, Any] = {
        "seed": setting.seed,
        "problem.task": task,
        **arm_values(arm, args.evidence),
        **measure.equal_budget(measure.BUDGET_KEYS[args.clock], args.cpu_minutes * 60.0),
        **args.extra_values,
        **measure.parse_sets(args.sets),
    }
    if args.model:
        values["problem.model"] = args.model
    return values


def train(setting: Setting, arm: str, args: argparse.Namespace) -> None:
    """One arm of a setting through ``esbox optimize``; its steps, CPU seconds and stop reason."""
    directory = run_dir(setting, arm, args)
    if directory.exists():
        shutil.rmtree(directory)
    flags = measure.set_flags(run_values(setting, arm, args))
    measure.run_esbox(
        ["optimize", "-q", "--config", CONFIG, "--out", str(directory), *flags],
        timeout=args.timeout,
    )
    rows = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((directory / "summary.json").read_text())
    setting.runs[arm] = {
        "steps": len(rows),
        "cpu_seconds": rows[-1].get("cpu_seconds"),
        "stop_reason": summary.get("stop_reason"),
    }
    print(f"trained {setting.name} {arm}: {setting.runs[arm]}", file=sys.stderr, flush=True)


def run_dir(setting: Setting, arm: str, args: argparse.Namespace) -> Path:
    return Path(args.runs or args.csv).resolve() / "ahd" / setting.name / arm


def score(setting: Setting, args: argparse.Namespace) -> None:
    """The start model and the three final models on the held-out examples, in one child."""
    spec = {
        "runs": [str(run_dir(setting, arm, args)) for arm in ARMS],
        "base": SKILL,
        "heldout": args.heldout,
        "threads": 1,
    }
    found = measure.run_child(CHILD_MODULE, spec, timeout=args.timeout)["models"]
    setting.models = dict(zip(("base", *ARMS), found, strict=True))


# -- the report ---------------------------------------------------------------------------------
HEADERS = ["arm", "held-out reward", "both − arm (paired SE)", "both won/lost", "errors",
           "CPU s", "steps"]  # fmt: skip


def rows_of(setting: Setting) -> list[list[Any]]:
    """The setting's table: one row a model (see the module docstring)."""
    both = setting.models["both"]["rewards"]
    rows = []
    for name, model in setting.models.items():
        rewards = model["rewards"]
        mean, se = mean_se(rewards)
        versus, won = "—", "—"
        if name != "both":
            _, gain, gain_se = paired(rewards, [both])
            versus = f"{gain:+.4f} ± {gain_se:.4f}"
            wins = sum(b > r for b, r in zip(both, rewards, strict=True))
            won = f"{wins}/{sum(b < r for b, r in zip(both, rewards, strict=True))}"
        run = setting.runs.get(name, {})
        cpu = f"{run['cpu_seconds']:.0f}" if run.get("cpu_seconds") is not None else "—"
        errors = sum(e is not None for e in model["errors"])
        rows.append([name, f"{mean:.4f} ± {se:.4f}", versus, won,
                     f"{errors}/{len(rewards)}", cpu, run.get("steps", "—")])  # fmt: skip
    return rows


def verdict(results: list[Setting]) -> str:
    """ "both improves its matched baseline in N of M settings", with how many clear 2 SE."""
    lines = []
    for other in (BASELINE, "contexts"):
        gains = [paired(s.models[other]["rewards"], [s.models["both"]["rewards"]])[1:]
                 for s in results]  # fmt: skip
        better = sum(g > 0 for g, _ in gains)
        clear = sum(g > 2 * se for g, se in gains if math.isfinite(se))
        label = "its matched baseline (parameters only)" if other == BASELINE else "contexts only"
        lines.append(f"both improves {label} in {better} of {len(results)} settings "
                     f"({clear} by more than 2 paired SE)")  # fmt: skip
    return "\n".join(lines)


def report(results: list[Setting], args: argparse.Namespace) -> str:
    """Every setting's table, the summary table and the N of M lines; CSV files alongside."""
    parts, every, summary = [], [], []
    for setting in results:
        rows = rows_of(setting)
        parts.append(f"### {setting.name}\n\n" + measure.table(HEADERS, rows, "lllllrr"))
        every += [[setting.task, setting.size, setting.seed, *row] for row in rows]
        named = {row[0]: row for row in rows}
        summary.append([setting.name, *(named[arm][1] for arm in ARMS),
                        named["parameters"][2], named["contexts"][2]])  # fmt: skip
        stopped = [a for a, r in setting.runs.items() if r["stop_reason"] != "max_cpu_seconds"]
        if stopped:
            parts.append(f"(stopped before the CPU budget: {', '.join(stopped)})")
    heads = ["setting", "parameters", "contexts", "both", "both − parameters", "both − contexts"]
    parts.append("### all settings\n\n" + measure.table(heads, summary))
    parts.append(verdict(results))
    measure.write_tables(
        Path(args.csv) / "ahd", {"ahd": (["task", "size", "seed", *HEADERS], every),
                                 "ahd_summary": (heads, summary)},
    )  # fmt: skip
    if args.quick or args.seeds < 2 or len(results) < 6:
        parts.append("(fewer than 6 settings, 2 seeds, or --quick: not a result)")
    return "\n\n".join(parts)


def quick_setup(args: argparse.Namespace) -> None:
    """``--quick``: a tiny random model, tiny instances and examples, a few CPU seconds."""
    from esbox.adapters.models.testing import save_tiny_lm

    folder = Path(args.csv).resolve() / "ahd-quick"
    args.model = str(save_tiny_lm(folder / "tiny-lm", max_position_embeddings=4096))
    args.binpacking, args.tsp, args.seeds = "10", "", 1  # one setting: 3 runs, 1 scoring
    args.cpu_minutes, args.heldout = min(args.cpu_minutes, 0.02), 2
    args.extra_values = {
        "problem.max_new_tokens": 4, "problem.batch_size": 2, "problem.proposer_max_new_tokens": 4,
        "options.population": 4,
    }  # fmt: skip
    args.task_values = {"train_size": 4}
    args.runs = str(folder)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        quick_setup(args)
    results = settings(args)
    if not results or args.seeds < 1 or args.heldout < 1:
        raise SystemExit(
            "no settings: give --binpacking or --tsp sizes, --seeds and --heldout >= 1"
        )
    jobs = [(s, arm) for s in results for arm in ARMS]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(lambda job: train(*job, args), jobs))
        list(pool.map(lambda s: score(s, args), results))
    print(report(results, args))
    print("\n" + measure.environment(threads=1))
    if args.json:
        raw = [{"setting": s.name, "runs": s.runs, "models": s.models} for s in results]
        Path(args.json).write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
