"""The heuristics an AHD task scored, written to the run's ``trajectories.jsonl`` each step.

One record per distinct (code, example) a step scored, with how often it was scored (members
whose greedy replies agree score the same code), its reward, costs and error, so a run shows
what the model tried. Held-out validation's scoring lands in the step it ran in. Both callbacks
here are checkpointed with what the step's completed evaluation gathered (marked by the
runner's ``on_step_evaluated``), not what an interrupted evaluation or validation had, which a
resume runs again: a resumed run logs and counts what it would have without the interrupt.
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
        self.evaluated = 0  # the attempts of the pending step's completed evaluation

    def start(self, directory: Path) -> None:
        """Records go to ``directory/trajectories.jsonl``."""
        self.log = TrajectoryLog(Path(directory) / TRAJECTORIES_FILE)

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        attempts, self.task.attempts, self.evaluated = self.task.attempts, [], 0
        grouped: dict[tuple, dict[str, Any]] = {}
        for attempt in attempts:
            key = (attempt["code"], attempt["split"], attempt["index"])
            grouped.setdefault(key, {**attempt, "times": 0})["times"] += 1
        if self.log is not None:
            self.log.write(int(metrics.get("step", runner.strategy.step)), list(grouped.values()))

    def on_step_evaluated(self, runner: Any) -> None:
        self.evaluated = len(self.task.attempts or [])

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the log's size, so a resume drops what came after it, and
        the completions the pending step's evaluation scored (none between steps)."""
        return {
            "log_size": self.log.size() if self.log else None,
            "pending": list((self.task.attempts or [])[: self.evaluated]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.log is not None and state.get("log_size") is not None:
            self.log.truncate(int(state["log_size"]))
        self.task.attempts = list(state.get("pending", []))
        self.evaluated = len(self.task.attempts)


class HeuristicFigures:
    """Runner callback: the AHD task's counters (completions scored, errors of each kind) as
    the step's ``ahd_*`` figures, counted afresh each step."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.evaluated = self._counts()  # what the pending step's evaluation counted

    def _counts(self) -> dict[str, Any]:
        task = self.task
        return {"scored": task.scored, "errors": task.errors, "kinds": dict(task.error_kinds)}

    def __call__(self, runner: Any, metrics: dict[str, Any]) -> None:
        metrics.update(self.task.metrics(reset=True))
        self.evaluated = self._counts()

    def on_step_evaluated(self, runner: Any) -> None:
        self.evaluated = self._counts()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counts of the pending step's evaluation (0 between
        steps: what an interrupted evaluation or validation counted, a resume counts again)."""
        return dict(self.evaluated)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.task.scored, self.task.errors = int(state["scored"]), int(state["errors"])
        self.task.error_kinds.clear()
        self.task.error_kinds.update({k: int(v) for k, v in state["kinds"].items()})
        self.evaluated = self._counts()
