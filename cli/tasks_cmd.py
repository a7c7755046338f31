"""``esbox tasks``: the task kinds of ``problem.task``, and the names a kind offers (reasoning-gym
datasets, TextArena games)."""

from __future__ import annotations

import click

from esbox.cli.errors import CLIError

LISTED = ("reasoning_gym", "textarena")


@click.command(short_help="List task kinds, or the datasets/games of one.")
@click.argument("kind", required=False)
def tasks(kind: str | None) -> None:
    """List the task kinds, or the names KIND offers: reasoning_gym (dataset names for
    ``name:``) or textarena (the offline game ids for ``id:``)."""
    from esbox.adapters.tasks.loading import TASK_KINDS

    if kind is None:
        click.echo("  ".join(TASK_KINDS))
        click.echo(f"\nesbox tasks KIND lists the names of {' or '.join(LISTED)}.")
        return
    try:
        if kind == "reasoning_gym":
            from esbox.adapters.tasks.reasoning_gym import dataset_names as names
        elif kind == "textarena":
            from esbox.adapters.environments.textarena import game_ids as names
        else:
            raise CLIError(f"esbox tasks lists the names of {' or '.join(LISTED)}, not {kind!r}")
        listed = names()
    except (ImportError, ValueError) as exc:  # ConfigError: the package is missing
        raise CLIError(str(exc)) from None
    click.echo(click.wrap_text("  ".join(listed), width=100))
