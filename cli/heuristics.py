"""``esbox heuristics``: the best heuristics an AHD run found, rescored on the same instances."""

from __future__ import annotations

from pathlib import Path

import click

from esbox.cli.errors import CLIError
from esbox.errors import ConfigError


@click.command("heuristics")
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True,
              help="rescore this many of the best logged codes")  # fmt: skip
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="rescore on the first N examples of the split (default: all)")  # fmt: skip
@click.option("--save", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="write the best code to this file")  # fmt: skip
def heuristics(run_dir: Path, top: int, limit: int | None, save: Path | None) -> None:
    """Rank the heuristics an AHD run tried, and score the best again on one split.

    Every distinct code in RUN_DIR/trajectories.jsonl is ranked by the reward logged for it;
    the TOP best are run again in the sandbox on every example of the held-out split (the
    optimized instance set itself in a run with problem.task.test_time), so that codes logged
    on different examples compare on the same instances. Prints a table (mean reward, examples
    on which the code beats the reference, its cost against the reference's, errors) and the
    best code.

    \b
    Examples:
      esbox heuristics runs/ahd-binpacking
      esbox heuristics runs/ahd-binpacking --top 10 --save best_priority.py
    """
    from esbox.adapters.problems.best_heuristics import best_heuristics

    try:
        found = best_heuristics(run_dir, top=top, limit=limit)
    except (ConfigError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    if not found:
        raise CLIError(f"{run_dir}: the model wrote no code in any logged step")
    click.echo("| rank | mean reward | beats ref. | cost (reference) | errors | logged | step |")
    click.echo("|---:|---:|---:|---:|---:|---:|---:|")
    for rank, result in enumerate(found, 1):
        cost = "invalid" if result.cost is None else f"{result.cost:g}"
        errors = sum(e is not None for e in result.errors)
        click.echo(
            f"| {rank} | {result.mean_reward:.4f} | {result.beats}/{len(result.rewards)} | "
            f"{cost} ({result.reference:g}) | {errors} | {result.candidate.logged_reward:.4f} "
            f"x{result.candidate.times} | {result.candidate.first_step} |"
        )
    best = found[0]
    click.echo(f"\nbest, first scored at step {best.candidate.first_step}:\n")
    click.echo(best.candidate.code.rstrip())
    if save is not None:
        save.write_text(best.candidate.code)
