"""``esbox optimize``: run a strategy on a problem from a YAML config, flags and overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from esbox.cli.budget_from import apply_overrides_with_budget, budget_from_options
from esbox.cli.errors import user_errors
from esbox.cli.run import (
    dry_run as check_run,
)
from esbox.cli.run import (
    execute,
    finish,
    make_run_directory,
    prepare,
    resolve_config,
    write_config,
)
from esbox.registry import get_strategy
from esbox.runconfig import dumps_yaml, load_yaml, split_options

EPILOG = """\b
Examples:
  esbox optimize --strategy copes
  esbox optimize --config examples/rastrigin-copes.yaml --set options.sigma=0.1
  esbox optimize --set problem.name=rosenbrock --set problem.dimension=50 \\
                 --set budget.max_steps=300 --out runs/rosen
  esbox optimize --config run.yaml --dry-run      # print the resolved config
  esbox optimize --config examples/llm-arith.yaml --strategy esopt
  esbox optimize --config examples/agent-math.yaml --budget-from runs/agent-math-grpo

\b
Main keys (all of them: docs/cli.md; strategy options: esbox strategies NAME):
  strategy                 copes | openai_es | esopt | ...
  options.population       members per step (N)
  options.sigma            noise scale, or {kind: cosine, start: .., end: .., steps: ..}
  options.learning_rate    step size (a number or a schedule)
  problem.kind             function | callable | llm
  problem.name             rastrigin, sphere, rosenbrock, ... (kind: function)
  problem.dimension        number of parameters
  problem.target           module:function (kind: callable)
  budget.max_evaluations   stop before exceeding this many evaluations
  budget.max_steps         stop after this many steps
  checkpoint.every         steps between checkpoints
  output.dir               run directory (default runs/{strategy}-{time})
"""


@click.command(epilog=EPILOG, short_help="Run a strategy on a problem into a new run directory.")
@click.option(
    "--config",
    "-c",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML run config; flags and --set override it.",
)
@click.option(
    "--strategy",
    "-s",
    help="Strategy name (overrides the config's `strategy`; config options the new strategy "
    "does not take, such as CoPES's `subspaces`, are dropped with a note).",
)
@click.option("--seed", type=int, help="Run seed (overrides the config's `seed`).")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key by its dotted path; VALUE is YAML. Repeatable.",
)
@click.option("--out", "-o", help="Run directory (overrides `output.dir`).")
@click.option("--overwrite", is_flag=True, help="Replace an existing run directory.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--dry-run", is_flag=True, help="Check and print the resolved config; run nothing.")
@budget_from_options
def optimize(
    config_path: Path | None,
    strategy: str | None,
    seed: int | None,
    overrides: tuple[str, ...],
    out: str | None,
    overwrite: bool,
    quiet: bool,
    dry_run: bool,
    budget_from: Path | None,
    budget_at: str,
) -> None:
    """Optimize a problem with an ES strategy; writes a run directory.

    With no config this runs the built-in default: rastrigin in 100 dimensions, 20000
    evaluations, into runs/<strategy>-<time>/ (config.yaml, metrics.jsonl, checkpoints/,
    best.npy, summary.json).
    """
    with user_errors():
        raw = load_yaml(config_path) if config_path is not None else {}
        if strategy is not None:
            raw = _switch_strategy(raw, strategy)
        flags = {"strategy": strategy, "seed": seed, "output.dir": out}
        settings = [
            f"{key}={_yaml_scalar(value)}" for key, value in flags.items() if value is not None
        ]
        raw = apply_overrides_with_budget(raw, [*settings, *overrides], budget_from, budget_at)
    config = resolve_config(raw)
    if dry_run:
        check_run(config)
        click.echo(dumps_yaml(config), nl=False)
        return
    session = prepare(config)
    try:  # a pool's actors and the Ray started for them go, however the run ends
        directory = make_run_directory(config, overwrite=overwrite)
        write_config(directory, config)
        finish(execute(session, directory, quiet=quiet, resume=False))
    finally:
        session.close()


def _switch_strategy(raw: dict[str, Any], strategy: str) -> dict[str, Any]:
    """The config with ``--strategy``'s choice: the config's options that only its own strategy
    takes (CoPES's ``subspaces`` for ``--strategy esopt``) are dropped, with a note.

    Options set with ``--set`` are applied afterwards and still checked.
    """
    options = raw.get("options")
    if raw.get("strategy", strategy) == strategy or not isinstance(options, dict):
        return raw
    get_strategy(strategy)  # an unknown name fails here, naming the strategies
    kept, dropped = split_options(strategy, options)
    if dropped:
        click.echo(
            f"note: --strategy {strategy} drops the config's options it does not take: "
            f"{', '.join(dropped)}",
            err=True,
        )
    return {**raw, "options": kept}


def _yaml_scalar(value: object) -> str:
    """A flag value as a YAML scalar that reads back as the same string or number."""
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"
