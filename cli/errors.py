"""CLI errors: bad input exits with status 2 and a message naming the key, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click

from esbox.errors import ConfigError, ResumeError


class CLIError(click.ClickException):
    """A user error: printed as ``Error: message``, exit status 2."""

    exit_code = 2


class RunFailed(click.ClickException):
    """The run started but its objective never gave a usable reward: ``Error: ...``, exit 3."""

    exit_code = 3


@contextmanager
def user_errors(prefix: str = "") -> Iterator[None]:
    """Turn ConfigError / ResumeError (and ``extra`` types) raised inside into a CLIError."""
    try:
        yield
    except (ConfigError, ResumeError, FileNotFoundError) as exc:
        message = str(exc) if not isinstance(exc, FileNotFoundError) else _missing(exc)
        raise CLIError(f"{prefix}{message}") from None


def _missing(exc: FileNotFoundError) -> str:
    if exc.filename:
        return f"{exc.filename}: no such file or directory"
    return str(exc)
