"""The esbox CLI run in this process with ``--set`` overrides, as the example-config tests run
it (a tiny model and small sizes set over a shipped config)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from click.testing import CliRunner, Result

from esbox.cli.main import cli


def invoke_cli(args: Sequence[str], sets: Iterable[str] = (), catch: bool = False) -> Result:
    """``esbox ARGS --set S1 --set S2 ...``; exceptions propagate unless ``catch``."""
    flags = [flag for item in sets for flag in ("--set", item)]
    return CliRunner().invoke(cli, [*args, *flags], catch_exceptions=catch)
