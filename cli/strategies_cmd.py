"""``esbox strategies``: the registered strategies, their options, defaults and descriptions."""

from __future__ import annotations

import inspect
from typing import get_type_hints

import click

from esbox.cli.errors import user_errors
from esbox.config import describe_options
from esbox.registry import available_strategies, get_strategy, strategy_families
from esbox.schedules import ScheduleLike


def _default(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    return str(value).replace("True", "true").replace("False", "false")


def _type(cls: type, row: dict) -> str:
    """The option's type, with schedule-or-number options named as such."""
    if get_type_hints(cls)[row["name"]] == ScheduleLike:
        return "float|schedule"
    return row["type"]


def _brief(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return cls.description or (doc.splitlines()[0] if doc else "")


@click.command(short_help="List strategies, or show one with its options.")
@click.argument("name", required=False)
def strategies(name: str | None) -> None:
    """List the registered strategies (built-in and plugins), or show NAME in full."""
    if name is None:
        for key, cls in available_strategies().items():
            click.echo(f"{click.style(key, bold=True)}  {_brief(cls)}")
            options = ", ".join(
                f"{r['name']}={_default(r['default'])}" for r in describe_options(cls.Options)
            )
            click.echo(click.wrap_text(options, initial_indent="    ", subsequent_indent="    "))
        for pattern, summary in strategy_families().items():
            click.echo(f"{click.style(pattern, bold=True)}  {summary}")
        click.echo("\nesbox strategies NAME shows one strategy with every option's help.")
        return
    with user_errors():
        cls = get_strategy(name)
    click.echo(f"{click.style(name, bold=True)}: {_brief(cls)}")
    module_doc = inspect.getdoc(inspect.getmodule(cls)) or ""
    if module_doc:
        click.echo("\n" + module_doc)
    click.echo("\nOptions (set them under `options:` in a run config, or --set options.KEY=VALUE):")
    rows = describe_options(cls.Options)
    click.echo(
        f"  {'name':<{max(len(r['name']) for r in rows)}}  {'type':<14} {'default':<16} help"
    )
    width = max(len(r["name"]) for r in rows)
    for row in rows:
        help_text = row["help"]
        if row["choices"]:
            help_text += f" [{' | '.join(row['choices'])}]"
        default = _default(row["default"])
        click.echo(
            f"  {row['name']:<{width}}  {_type(cls.Options, row):<14} {default:<16} {help_text}"
        )
