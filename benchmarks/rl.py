"""ES against GRPO at equal CPU time, tuned alike: the base model, CoPES, OpenAI-ES, GRPO and
LoRA-GRPO on the shipped SmolLM2-135M, single-turn arithmetic and the agent-math tool task.

The protocol, the same for every method:

1. **Tuning.** ``--tuning`` runs a method (3 by default), seed 0, each at the same CPU budget:
   learning rates for GRPO and LoRA-GRPO, learning rate and sigma together for the ES methods
   (:data:`GRIDS`, multiples of the config's values). Each tuned model is scored greedily on
   the **validation** questions, the first ``--validation`` of the task's held-out split; the
   best one (the first on a tie) is the method's setting. With ``--tuning 1`` there is
   nothing to choose, and no tuning run is trained.
2. **Final runs.** The chosen setting runs with ``--seeds`` new seeds (1, 2, ...), each stopped at
   the same CPU seconds (``budget.max_cpu_seconds``, the run process's CPU clock, all threads;
   one torch thread a run), with no validation inside the run.
3. **Held-out test.** The base model and every final model are scored on the next ``--heldout``
   questions, which no choice above saw: greedy accuracy with its standard error, the change
   against the base with the *paired* standard error (question by question), pass@k from
   ``--samples`` sampled rollouts, each ES method's gain as a fraction of GRPO's (the CoPES
   paper's metric), the samples each run generated, its peak RSS and CPU seconds.

Every training run is the real CLI (``esbox optimize`` / ``esbox grpo``) in its own process,
every evaluation a fresh process (:mod:`benchmarks.rl_children`); ``--jobs`` runs that many
at once. Fewer than 3 tuning runs or 2 seeds is marked "not a result" under the table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks import measure
from benchmarks.rl_report import ES_METHODS, figure, report

CHILD_MODULE = "benchmarks.rl_children"
METHODS = ("copes", "openai_es", "grpo", "lora_grpo")
TASKS = {  # the ES config, the GRPO config: the same task, model and agent settings
    "arithmetic": ("examples/llm-arith.yaml", "examples/llm-arith-grpo.yaml"),
    "agent-math": ("examples/agent-math.yaml", "examples/agent-math.yaml"),
}
GRIDS = {  # tuning settings as multiples of the config's: the same count for every method
    "es": [(1.0, 1.0), (2.0, 1.0), (2.0, 2.0)],  # (learning rate, sigma)
    "grpo": [1.0, 3.0, 10.0],  # learning rate (the configs' 1e-6 is untuned and low)
    "lora_grpo": [10.0, 30.0, 100.0],  # LoRA trains far fewer weights: larger steps
}
GRPO_LEARNING_RATE = 1e-6  # TRL's default, when a config's grpo: section has none
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks rl", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tasks", default="arithmetic,agent-math", help="comma-separated")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    parser.add_argument(
        "--cpu-minutes", type=float, default=5.0, help="budget of a run, in minutes of --clock"
    )
    parser.add_argument("--tuning", type=int, default=3, help="tuning runs a method (1-3)")
    parser.add_argument("--seeds", type=int, default=2, help="final runs a method")
    parser.add_argument("--validation", type=int, default=50, help="validation questions")
    parser.add_argument("--heldout", type=int, default=100, help="held-out test questions")
    parser.add_argument("--samples", type=int, default=8, help="sampled rollouts for pass@k")
    parser.add_argument("--model", default=None, help="local HF model folder (default: shipped)")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="TASK=ES.yaml,GRPO.yaml",
        help="other configs for a task (repeatable)",
    )
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per process")
    parser.add_argument("--runs", default=None, help="run directories go here (default: --out)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny random model and task: tests the protocol, measures nothing",
    )
    parser.add_argument("--json", default=None, help="also write the raw results here")
    measure.add_clock_option(parser)
    parser.add_argument(
        "--es-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more --set for the ES runs (repeatable), e.g. problem.backend=vllm",
    )
    parser.add_argument(
        "--grpo-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more --set for the GRPO runs (repeatable), e.g. grpo.use_vllm=true",
    )
    measure.add_jobs_option(parser)
    measure.add_output_option(parser)
    return parser


# -- the plan -----------------------------------------------------------------------------------
@dataclass
class Run:
    """One training run: a method, its setting (config overrides), a seed, where it goes."""

    task: str
    method: str
    setting: dict[str, Any]
    seed: int
    directory: Path
    config: str
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return "grpo" if self.method in ("grpo", "lora_grpo") else "optimize"


def tuning_settings(
    method: str, es_config: dict[str, Any], grpo_config: dict[str, Any], count: int
) -> list[dict[str, Any]]:
    """The first ``count`` settings of :data:`GRIDS` for ``method``, as config overrides."""
    if method in ES_METHODS:
        options = es_config.get("options") or {}
        lr, sigma = float(options["learning_rate"]), float(options["sigma"])
        grid = [
            {"options.learning_rate": lr * a, "options.sigma": sigma * b} for a, b in GRIDS["es"]
        ]
    else:
        base = float((grpo_config.get("grpo") or {}).get("learning_rate", GRPO_LEARNING_RATE))
        grid = [{"grpo.learning_rate": base * a} for a in GRIDS[method]]
    return grid[:count]


def overrides(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    """Config overrides of a run: its setting, seed and equal budget
    (:func:`benchmarks.measure.equal_budget`); GRPO keeps a constant learning rate, since a
    CPU stop would otherwise cut its decay short at a point no other method sees."""
    values: dict[str, Any] = {
        **run.setting,
        "seed": run.seed,
        **measure.equal_budget(measure.BUDGET_KEYS[args.clock], args.cpu_minutes * 60.0),
    }
    if args.model:
        values["problem.model"] = args.model
    values.update(measure.parse_sets(args.es_set if run.method in ES_METHODS else args.grpo_set))
    if run.method not in ES_METHODS:  # the ES strategy comes as --strategy
        values["grpo.lr_scheduler_type"] = "constant"
        values["grpo.num_train_epochs"] = 10_000  # the CPU budget stops it, not the data
    if run.method == "lora_grpo":
        values.update({f"lora.{k}": v for k, v in LORA.items()})
    return values


def train(run: Run, args: argparse.Namespace) -> Run:
    """The run through the real CLI in its own process; its last metrics row joins ``results``."""
    if run.directory.exists():
        shutil.rmtree(run.directory)
    strategy = ["--strategy", run.method] if run.method in ES_METHODS else []
    arguments = [run.command, "-q", "--config", run.config, *strategy, "--out", str(run.directory)]
    measure.run_esbox([*arguments, *measure.set_flags(overrides(run, args))], timeout=args.timeout)
    rows = [json.loads(line) for line in (run.directory / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    summary = json.loads((run.directory / "summary.json").read_text())
    run.results = {
        "steps": len(rows),
        "samples": last.get("samples"),
        "cpu_seconds": last.get("cpu_seconds"),
        "peak_rss_mib": last.get("peak_rss_mib"),
        "stop_reason": summary.get("stop_reason"),
    }
    print(
        f"trained {run.task} {run.method} seed {run.seed} {run.setting}: {run.results}",
        file=sys.stderr,
        flush=True,
    )
    return run


def score(
    run_dir: Path, args: argparse.Namespace, start: int, stop: int, samples: int, base: bool = False
) -> dict[str, Any]:
    """One model's per-question results on held-out questions ``start:stop``, in a child."""
    spec = {
        "run": str(run_dir),
        "base": base,
        "start": start,
        "stop": stop,
        "samples": samples,
        "threads": 1,
    }
    return measure.run_child(CHILD_MODULE, spec, timeout=args.timeout)


# -- the suite ----------------------------------------------------------------------------------
def configs_for(task: str, args: argparse.Namespace) -> tuple[str, str]:
    """The ES and GRPO configs of a task (``--config`` overrides them)."""
    chosen = dict(TASKS)
    for item in args.config:
        name, _, pair = item.partition("=")
        es, _, grpo = pair.partition(",")
        chosen[name] = (es, grpo or es)
    if task not in chosen:
        raise SystemExit(f"unknown task {task!r}; known: {', '.join(chosen)}")
    return chosen[task]


def check_same_problem(es_config: dict[str, Any], grpo_config: dict[str, Any], task: str) -> None:
    """Both configs must pose the same problem: same model, task, agent and dtype."""
    for key in ("model", "task", "agent", "dtype"):
        a, b = (
            (es_config.get("problem") or {}).get(key),
            (grpo_config.get("problem") or {}).get(key),
        )
        if a != b:
            raise SystemExit(
                f"{task}: problem.{key} differs between the ES and GRPO configs "
                f"({a!r} against {b!r}); the comparison would not be fair"
            )


def run_task(task: str, methods: list[str], args: argparse.Namespace, pool: Any) -> dict[str, Any]:
    """Tuning, selection, final runs and the held-out test of every method on one task."""
    es_path, grpo_path = configs_for(task, args)
    es_config, grpo_config = (
        yaml.safe_load((measure.ROOT / p).read_text()) for p in (es_path, grpo_path)
    )
    check_same_problem(es_config, grpo_config, task)
    root = Path(args.runs or args.csv).resolve() / "rl" / task
    validation = (0, args.validation)
    test = (args.validation, args.validation + args.heldout)

    def make(method: str, setting: dict[str, Any], seed: int, name: str) -> Run:
        config = grpo_path if method in ("grpo", "lora_grpo") else es_path
        return Run(task, method, setting, seed, root / name, str(config))

    candidates = [
        make(m, s, 0, f"tune-{m}-{i}")
        for m in methods
        for i, s in enumerate(tuning_settings(m, es_config, grpo_config, args.tuning))
    ]
    # one setting a method leaves nothing to choose: no tuning run is trained then
    tuning = candidates if args.tuning > 1 else []
    list(pool.map(lambda r: train(r, args), tuning))
    for run, result in zip(
        tuning, pool.map(lambda r: score(r.directory, args, *validation, 0), tuning), strict=True
    ):
        run.results["validation_accuracy"] = statistics.fmean(result["greedy"])
        shutil.rmtree(run.directory / "model", ignore_errors=True)  # only the final models stay
    chosen = {}
    for method in methods:
        runs = [r for r in candidates if r.method == method]
        chosen[method] = max(runs, key=lambda r: r.results.get("validation_accuracy", 0.0))
    finals = [
        make(m, chosen[m].setting, seed, f"{m}-seed{seed}")
        for m in methods
        for seed in range(1, args.seeds + 1)
    ]
    list(pool.map(lambda r: train(r, args), finals))
    jobs = [(finals[0].directory, True)] + [(r.directory, False) for r in finals]
    scores = list(pool.map(lambda j: score(j[0], args, *test, args.samples, base=j[1]), jobs))
    base, by_run = scores[0], dict(zip((r.directory for r in finals), scores[1:], strict=True))
    return {
        "task": task,
        "tuning": tuning,
        "finals": finals,
        "base": base,
        "scores": by_run,
        "chosen": chosen,
    }


def quick_setup(args: argparse.Namespace) -> None:
    """``--quick``: a tiny random model and small arithmetic configs in the output folder."""
    from esbox.adapters.models.testing import save_tiny_lm

    folder = Path(args.csv).resolve() / "rl-quick"
    model = save_tiny_lm(folder / "tiny-lm")
    problem = {
        "kind": "llm",
        "model": str(model),
        "max_new_tokens": 4,
        "batch_size": 2,
        "task": {"kind": "arithmetic", "train_size": 32, "heldout_size": 8},
    }
    es = {
        "strategy": "copes",
        "problem": problem,
        "options": {"population": 4, "subspaces": 2, "sigma": 0.01, "learning_rate": 0.01},
    }
    grpo = {
        "problem": problem,
        "grpo": {"num_generations": 2, "learning_rate": 1e-3, "gradient_checkpointing": False},
    }
    for name, config in (("es.yaml", es), ("grpo.yaml", grpo)):
        (folder / name).write_text(yaml.safe_dump(config))
    args.config = [f"arithmetic={folder / 'es.yaml'},{folder / 'grpo.yaml'}"]
    args.tasks, args.model = "arithmetic", None
    args.validation, args.heldout, args.samples = 4, 4, 2
    args.cpu_minutes = min(args.cpu_minutes, 0.05)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        quick_setup(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    if not 1 <= args.tuning <= 3 or args.seeds < 1:
        raise SystemExit("--tuning takes 1 to 3 (the grids' size) and --seeds at least 1")
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = [run_task(t.strip(), methods, args, pool) for t in args.tasks.split(",")]
    found: dict[str, Any] = {}
    parts = []
    for result in results:
        text, tables = report(result, methods, args)
        parts.append(text)
        found.update(tables)
    measure.write_tables(args.csv, found)
    plot = figure(results, methods, args)
    print("\n\n".join(parts))
    print(f"\n![held-out accuracy against CPU-minutes]({plot})\n")
    print(measure.environment(threads=1))
    if args.json:
        raw = {
            r["task"]: {
                "base": r["base"],
                "runs": [
                    {
                        "method": run.method,
                        "seed": run.seed,
                        "setting": run.setting,
                        **run.results,
                        **(
                            {"test": r["scores"][run.directory]}
                            if run.directory in r["scores"]
                            else {}
                        ),
                    }
                    for run in r["tuning"] + r["finals"]
                ],
            }
            for r in results
        }
        Path(args.json).write_text(json.dumps(raw, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
