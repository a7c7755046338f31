"""What a run costs the machine: CPU seconds and peak resident memory of this process, and the
samples generated, so that runs of different methods (ES, GRPO) compare at equal compute."""

from __future__ import annotations

import resource
import time
from typing import Any

# metrics measured rather than computed: they differ between otherwise bit-identical runs
MEASURED_FIELDS = ("wall_seconds", "cpu_seconds", "peak_rss_mib")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ResourceUse:
    """Runner callback adding ``cpu_seconds`` (this process's CPU time since the callback was
    made, all threads; a resumed run continues from its history), ``peak_rss_mib`` and, given
    ``samples_per_evaluation`` (rollouts per member's evaluation), ``samples``."""

    def __init__(self, samples_per_evaluation: int | None = None) -> None:
        self.samples_per_evaluation = samples_per_evaluation
        self._start = time.process_time()
        self._offset: float | None = None

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        if self._offset is None:  # the first step of this process: after the logged ones
            earlier = [row for row in runner.history if row is not metrics]
            self._offset = float(earlier[-1].get("cpu_seconds") or 0.0) if earlier else 0.0
        metrics["cpu_seconds"] = self._offset + time.process_time() - self._start
        metrics["peak_rss_mib"] = peak_rss_mib()
        if self.samples_per_evaluation:
            metrics["samples"] = metrics["evaluations"] * self.samples_per_evaluation
