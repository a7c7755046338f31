"""What a run costs the machine: CPU seconds and peak resident memory of this process, and the
samples generated, so that runs of different methods (ES, GRPO) compare at equal compute."""

from __future__ import annotations

import resource
from typing import Any

# metrics measured rather than computed: they differ between otherwise bit-identical runs
MEASURED_FIELDS = ("wall_seconds", "cpu_seconds", "peak_rss_mib")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ResourceUse:
    """Runner callback adding ``cpu_seconds`` (the runner's CPU clock: this process, all threads,
    over every resume), ``peak_rss_mib`` and, given ``samples_per_evaluation`` (rollouts per
    member's evaluation), ``samples``."""

    def __init__(self, samples_per_evaluation: int | None = None) -> None:
        self.samples_per_evaluation = samples_per_evaluation

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        metrics["cpu_seconds"] = runner.cpu_seconds()
        metrics["peak_rss_mib"] = peak_rss_mib()
        if self.samples_per_evaluation:
            metrics["samples"] = metrics["evaluations"] * self.samples_per_evaluation
