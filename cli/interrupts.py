"""Ctrl-C and SIGTERM that never land inside an update, so the checkpoint they write is exact.

During evaluation an interrupt is raised at once (the step is simply redone on resume). From
``strategy.tell`` to the end of ``runner.step`` the strategy, the parameters and the counters
change together; an interrupt arriving there is held until the step is complete.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class InterruptGuard:
    """Signal handler + wrappers for one runner's ``strategy.tell`` and ``step``."""

    def __init__(self, runner: Any) -> None:
        self.holding = False
        self.pending = False
        tell, step = runner.strategy.tell, runner.step

        def guarded_tell(rewards: Any) -> Any:
            self.holding = True
            return tell(rewards)

        def guarded_step() -> Any:
            try:
                metrics = step()
            finally:
                self.holding = False
            if self.pending:
                self.pending = False
                raise KeyboardInterrupt
            return metrics

        runner.strategy.tell, runner.step = guarded_tell, guarded_step

    def handler(self, signum: int, frame: Any) -> None:
        if self.holding:
            self.pending = True
            return
        raise KeyboardInterrupt


@contextmanager
def guarded(runner: Any) -> Iterator[InterruptGuard]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt, but never mid-update."""
    guard = InterruptGuard(runner)
    previous = {}
    try:
        for sig in SIGNALS:
            previous[sig] = signal.signal(sig, guard.handler)
    except ValueError:  # not the main thread: signals stay as they are
        pass
    try:
        yield guard
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
