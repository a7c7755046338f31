"""``esbox resume``: continue an interrupted run from its last checkpoint, bit-identically."""

from __future__ import annotations

from pathlib import Path

import click

from esbox.checkpoint import latest_checkpoint
from esbox.cli.errors import CLIError, user_errors
from esbox.cli.grpo import resume_grpo
from esbox.cli.run import (
    CHECKPOINTS,
    execute,
    finish,
    prepare,
    read_config,
    resolve_config,
    write_config,
)
from esbox.runconfig import apply_overrides, parse_override

# Keys that may change when resuming: they do not alter the trajectory, only where it stops
# (or, for scale, where the members are scored).
RESUMABLE_SECTIONS = ("budget", "checkpoint", "scale")


@click.command(short_help="Continue an interrupted run, bit-identically.")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change budget.*, checkpoint.* or scale.* (e.g. extend the budget, or resume on "
    "another number of Ray workers). Repeatable.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def resume(run_dir: Path, overrides: tuple[str, ...], quiet: bool) -> None:
    """Continue the run in RUN_DIR from its newest checkpoint.

    The run goes on exactly as if it had never stopped (same parameters, optimizer state,
    step counter and seed stream) until its budget; `--set budget.max_steps=500` extends it.
    """
    raw = read_config(run_dir)
    with user_errors():
        for text in overrides:
            path, _ = parse_override(text)
            if path[0] not in RESUMABLE_SECTIONS or len(path) < 2:
                raise CLIError(
                    f"--set {'.'.join(path)}: only budget.*, checkpoint.* and scale.* can change "
                    f"when resuming; start a new run to change anything else"
                )
        if "grpo" in raw:  # a GRPO run's config (esbox grpo)
            return resume_grpo(run_dir, raw, overrides, quiet)
        raw = apply_overrides(raw, overrides)
    config = resolve_config(raw)
    _check_has_checkpoint(run_dir, config.checkpoint.every)
    session = prepare(config)
    try:  # a pool's actors and the Ray started for them go, however the run ends
        if overrides:
            write_config(run_dir, config)
        finish(execute(session, run_dir, quiet=quiet, resume=True))
    finally:
        session.close()


def _check_has_checkpoint(run_dir: Path, every: int) -> None:
    """Refuse a run without a checkpoint before anything loads, saying how to re-run it."""
    try:
        latest_checkpoint(run_dir / CHECKPOINTS)
    except FileNotFoundError:
        why = (
            "checkpoint.every is 0, so a checkpoint is only written on Ctrl-C or SIGTERM, and "
            "this run was killed or crashed"
            if every == 0
            else f"the run stopped before its first checkpoint (checkpoint.every: {every})"
        )
        raise CLIError(
            f"cannot resume: no checkpoint found in {run_dir / CHECKPOINTS} ({why}). "
            f"Re-run it from the start with: esbox optimize --config {run_dir / 'config.yaml'} "
            f"--out {run_dir} --overwrite (add --set checkpoint.every=10 to checkpoint "
            f"periodically)"
        ) from None
