"""``--budget-from RUN``: give a run the compute that another run spent, so that ES and GRPO
(in either direction) compare at equal cost: CPU seconds on a CPU, GPU seconds on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from esbox.cli.errors import CLIError
from esbox.cli.report import RunData, load_run
from esbox.runconfig import apply_overrides

BUDGET_AT = ("end", "best")
LIMITS = ("max_evaluations", "max_steps", "max_seconds", "max_cpu_seconds")

BUDGET_FROM_HELP = (
    "Stop at the compute run RUN_DIR spent (an ES or a GRPO run): its CPU seconds on a CPU, its "
    "wall seconds on a GPU (one GPU: GPU seconds). Replaces the config's budget limits; --set "
    "budget.max_steps=... after it adds a cap."
)
BUDGET_AT_HELP = (
    "With --budget-from: the compute to the run's end, or to the step of its best held-out "
    "accuracy (the CoPES paper's protocol: GRPO's best validation checkpoint)."
)


def budget_from_options(command: Any) -> Any:
    """The ``--budget-from`` and ``--budget-at`` options of a training command."""
    command = click.option("--budget-at", type=click.Choice(BUDGET_AT), default="end",
                           show_default=True, help=BUDGET_AT_HELP)(command)  # fmt: skip
    return click.option(
        "--budget-from", type=click.Path(file_okay=False, path_type=Path), metavar="RUN_DIR",
        help=BUDGET_FROM_HELP,
    )(command)  # fmt: skip


def _on_gpu(config: dict[str, Any]) -> bool:
    """Whether a run config's model ran on a GPU (the transformers device or vLLM)."""
    problem = config.get("problem") or {}
    return str(problem.get("device", "cpu")).startswith("cuda") or problem.get("backend") == "vllm"


def _reference_row(run: RunData, at: str) -> dict[str, Any]:
    """The metrics row whose clocks are the budget: the last, or the best held-out accuracy's."""
    if at == "end":
        return run.metrics[-1]
    validated = [row for row in run.metrics if row.get("val_accuracy") is not None]
    if not validated:
        raise CLIError(
            f"--budget-at best: {run.directory} logged no held-out accuracy (val_accuracy); "
            "give it problem.validation_every, or use --budget-at end"
        )
    return max(validated, key=lambda row: float(row["val_accuracy"]))  # the first of the best


def reference_budget(run_dir: Path, at: str = "end") -> tuple[str, float]:
    """(budget key, limit): the CPU seconds (``max_cpu_seconds``) that ``run_dir`` spent, or its
    wall seconds (``max_seconds``) when it ran on a GPU, to its end or its best accuracy."""
    run = load_run(Path(run_dir))
    key, column = ("max_seconds", "wall_seconds") if _on_gpu(run.config) else (
        "max_cpu_seconds", "cpu_seconds")  # fmt: skip
    value = _reference_row(run, at).get(column)
    if value is None:
        raise CLIError(
            f"{run_dir} logged no {column}: it was written before esbox measured it, or it is "
            "not an LLM run; give this run budget.max_seconds or budget.max_cpu_seconds instead"
        )
    return key, float(value)


def apply_overrides_with_budget(
    raw: dict[str, Any], overrides: list[str], run_dir: Path | None, at: str
) -> dict[str, Any]:
    """``apply_overrides`` after replacing the budget limits by ``run_dir``'s compute (when
    given), so ``--set budget.*`` still applies; a CPU run cannot take a GPU run's budget, nor
    the other way round."""
    if run_dir is None:
        return apply_overrides(raw, overrides)
    key, value = reference_budget(run_dir, at)
    budget = {**(raw.get("budget") or {}), **dict.fromkeys(LIMITS), key: value}
    raw = apply_overrides({**raw, "budget": budget}, overrides)
    reference_on_gpu, this_on_gpu = key == "max_seconds", _on_gpu(raw)
    if reference_on_gpu != this_on_gpu:
        where = {True: "a GPU", False: "a CPU"}
        raise CLIError(
            f"--budget-from {run_dir}: that run ran on {where[reference_on_gpu]} and this one "
            f"runs on {where[this_on_gpu]}; equal budgets need the same kind of device"
        )
    click.echo(f"budget from {run_dir} ({at}): budget.{key} = {value:.1f}", err=True)
    return raw
