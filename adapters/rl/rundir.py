"""A TRL ``TrainerCallback`` that keeps an esbox run directory: one ``metrics.jsonl`` row per
optimizer step (reward, held-out accuracy at validation steps, wall and CPU seconds, samples,
peak RSS), budget stops, and beside each TRL checkpoint what esbox needs to resume its logs.

Rows use the ES runs' keys where they mean the same: ``step`` counts from 0 and the row of
step s is written after update s + 1; ``val_step`` is the number of updates applied.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from esbox.resources import peak_rss_mib
from esbox.tracking import MetricsLogger, jsonable

STATE_FILE = "esbox_state.json"  # beside TRL's files in each checkpoint folder, written last


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so a kill leaves old or new."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _step(folder: Path) -> int:
    return int(folder.name.rsplit("-", 1)[1])


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest ``checkpoint-N`` folder whose esbox state was written (a complete one)."""
    done = [p for p in folder.glob("checkpoint-*") if (p / STATE_FILE).is_file()]
    return max(done, key=_step, default=None)


def prune_checkpoints(newest: Path, every: int, keep: int | None) -> None:
    """After ``newest`` is complete: remove the older checkpoints off the ``every`` schedule
    (written as a run ended or was interrupted) or cut short by a kill, then all but the
    ``keep`` newest, so a resumed or extended run keeps the checkpoints of a run that never
    stopped (as ``esbox.checkpoint.save_checkpoint`` does for ES runs)."""
    kept = []
    for old in sorted(newest.parent.glob("checkpoint-*"), key=_step):
        if old == newest:
            kept.append(old)
        elif (every and _step(old) % every) or not (old / STATE_FILE).is_file():
            shutil.rmtree(old)
        elif _step(old) < _step(newest):
            kept.append(old)
    for old in kept[:-keep] if keep is not None else ():
        shutil.rmtree(old)


class RunLog(TrainerCallback):
    """Writes the run's ``metrics.jsonl`` and checkpoint state; stops at ``max_seconds`` (wall),
    ``max_cpu_seconds`` or when :meth:`request_stop` was called (a signal), after a checkpoint
    at the step's end."""

    def __init__(
        self,
        directory: Path,
        reward: Any,
        validation: Any = None,
        *,
        max_seconds: float | None = None,
        max_cpu_seconds: float | None = None,
        figures: Callable[[], dict[str, float]] | None = None,
        checkpoint_every: int = 0,
        checkpoint_keep: int | None = None,
    ) -> None:
        self.directory, self.reward, self.validation = Path(directory), reward, validation
        self.checkpoint_every, self.checkpoint_keep = checkpoint_every, checkpoint_keep
        self.max_seconds, self.max_cpu_seconds, self.figures = max_seconds, max_cpu_seconds, figures
        self.logger = MetricsLogger(self.directory / "metrics.jsonl")
        self.history: list[dict[str, Any]] = []
        self.baseline: dict[str, Any] = {}
        self.best_reward: float | None = None
        self.stop_reason: str | None = None
        self._offsets = {"wall": 0.0, "cpu": 0.0, "rss": 0.0}
        self._start = (time.perf_counter(), time.process_time())
        self._pending: dict[str, Any] = {}

    # -- clocks ------------------------------------------------------------------------------
    def wall_seconds(self) -> float:
        return self._offsets["wall"] + time.perf_counter() - self._start[0]

    def cpu_seconds(self) -> float:
        return self._offsets["cpu"] + time.process_time() - self._start[1]

    def peak_rss(self) -> float:
        return max(self._offsets["rss"], peak_rss_mib())

    # -- resume --------------------------------------------------------------------------------
    def restore(self, checkpoint: Path) -> None:
        """Continue the logs of ``checkpoint``: its rows (later ones are dropped from the file),
        baseline, counters and clocks."""
        saved = json.loads((checkpoint / STATE_FILE).read_text())
        self.history, self.baseline = saved["history"], saved["baseline"]
        self.best_reward, self.reward.samples = saved["best_reward"], saved["samples"]
        self.reward.errors = saved["reward_errors"]
        self._offsets = {"wall": saved["wall_seconds"], "cpu": saved["cpu_seconds"],
                         "rss": saved["peak_rss_mib"]}  # fmt: skip
        self.logger.rewrite(self.history)

    def request_stop(self) -> None:
        """Stop after the current step, with a checkpoint (Ctrl-C, SIGTERM)."""
        self.stop_reason = "interrupted"

    # -- TrainerCallback -------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start = (time.perf_counter(), time.process_time())
        if self.validation is not None and not self.baseline:
            self.baseline = {"val_step": 0, **self._measure(kwargs["model"])}

    def _measure(self, model: Any) -> dict[str, float]:
        """Held-out figures by esbox's own evaluation, with the model in eval mode."""
        training = model.training
        model.eval()
        try:
            return self.validation.measure()
        finally:
            model.train(training)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        every = self.validation.every if self.validation is not None else 0
        if every and state.global_step % every == 0:
            self._pending = {"val_step": state.global_step, **self._measure(kwargs["model"])}
        if self.max_seconds is not None and self.wall_seconds() >= self.max_seconds:
            self.stop_reason = self.stop_reason or "max_seconds"
        if self.max_cpu_seconds is not None and self.cpu_seconds() >= self.max_cpu_seconds:
            self.stop_reason = self.stop_reason or "max_cpu_seconds"
        if self.stop_reason is not None:
            control.should_training_stop = True
        if control.should_training_stop or state.global_step >= state.max_steps:
            control.should_save = True  # the state where the run stops is always resumable

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "train_runtime" in logs:  # the trainer's closing summary, not a step
            return
        rewards = self.reward.drain()
        row: dict[str, Any] = {"step": state.global_step - 1}
        if rewards:
            mean = statistics.fmean(rewards)
            self.best_reward = mean if self.best_reward is None else max(self.best_reward, mean)
            row.update(reward_mean=mean, reward_max=max(rewards), reward_min=min(rewards),
                       reward_std=statistics.pstdev(rewards))  # fmt: skip
        row.update(
            best_reward=self.best_reward,
            learning_rate=logs.get("learning_rate"),
            wall_seconds=self.wall_seconds(),
            cpu_seconds=self.cpu_seconds(),
            samples=self.reward.samples,
            peak_rss_mib=self.peak_rss(),
            loss=logs.get("loss"),
            grad_norm=logs.get("grad_norm"),
            completion_tokens=logs.get("completions/mean_length"),
            reward_errors=self.reward.errors,
            **(self.figures() if self.figures is not None else {}),
            **self._pending,
        )
        self._pending = {}
        row = jsonable(row)
        self.history.append(row)
        self.logger(None, row)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        saved = {
            "history": self.history,
            "baseline": self.baseline,
            "best_reward": self.best_reward,
            "samples": self.reward.samples,
            "reward_errors": self.reward.errors,
            "wall_seconds": self.wall_seconds(),
            "cpu_seconds": self.cpu_seconds(),
            "peak_rss_mib": self.peak_rss(),
        }
        write_atomic(folder / STATE_FILE, json.dumps(jsonable(saved)) + "\n")
        prune_checkpoints(folder, self.checkpoint_every, self.checkpoint_keep)

    def close(self) -> None:
        self.logger.close()
