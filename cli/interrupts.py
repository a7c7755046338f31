"""SIGTERM behaves like Ctrl-C during a run, so ``kill`` also leaves an exact checkpoint.

The runner itself holds both signals while an update is applied (``esbox.runner.held_signals``),
so the checkpoint written on interrupt never contains a half-applied update.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def guarded(runner: Any) -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt like SIGINT does."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
