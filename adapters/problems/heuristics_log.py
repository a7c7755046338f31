"""The heuristics an AHD task scored, written to the run's ``trajectories.jsonl`` each step.

One record per distinct (code, example) a step scored, with how often it was scored (members
whose greedy replies agree score the same code), its reward, costs and error, so a run shows
what the model tried. Held-out validation's scoring lands in the step it ran in. Both callbacks
here are checkpointed: a step whose callbacks an interrupt cut short logs and counts on resume
what it would have without the interrupt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esbox.adapters.agents.config import TRAJECTORIES_FILE
from esbox.adapters.agents.evaluator import TrajectoryLog


class HeuristicLog:
    """Runner callback: the step's scored heuristics as JSONL records (see the module doc)."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.task.attempts = []  # the task records each scored completion from now on
        self.log: TrajectoryLog | None = None

    def start(self, directory: Path) -> None:
        """Records go to ``directory/trajectories.jsonl``."""
        self.log = TrajectoryLog(Path(directory) / TRAJECTORIES_FILE)

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        attempts, self.task.attempts = self.task.attempts, []
        grouped: dict[tuple, dict[str, Any]] = {}
        for attempt in attempts:
            key = (attempt["code"], attempt["split"], attempt["index"])
            grouped.setdefault(key, {**attempt, "times": 0})["times"] += 1
        if self.log is not None:
            self.log.write(int(metrics.get("step", runner.strategy.step)), list(grouped.values()))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the log's size, so a resume drops what came after it, and
        the completions scored since the last step's records."""
        return {
            "log_size": self.log.size() if self.log else None,
            "pending": list(self.task.attempts or []),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.log is not None and state.get("log_size") is not None:
            self.log.truncate(int(state["log_size"]))
        self.task.attempts = list(state.get("pending", []))


class HeuristicFigures:
    """Runner callback: the AHD task's counters (completions scored, errors of each kind) as
    the step's ``ahd_*`` figures, counted afresh each step."""

    def __init__(self, task: Any) -> None:
        self.task = task

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        metrics.update(self.task.metrics(reset=True))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counts since the last step's figures."""
        task = self.task
        return {"scored": task.scored, "errors": task.errors, "kinds": dict(task.error_kinds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.task.scored, self.task.errors = int(state["scored"]), int(state["errors"])
        self.task.error_kinds.clear()
        self.task.error_kinds.update({k: int(v) for k, v in state["kinds"].items()})
