"""Train a GRPO run into its run directory, or continue it from its newest checkpoint, and write
``summary.json`` with the keys of an ES run's summary where they apply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import esbox
from esbox.errors import ResumeError
from esbox.tracking import jsonable

from .rundir import RunLog, latest_checkpoint, write_atomic
from .session import CHECKPOINTS, GRPORun, build_trainer, save_model

SUMMARY_FILE = "summary.json"


class GRPOTraining:
    """A built GRPO run in ``directory``: ``run()`` trains it; ``log.request_stop()`` (from a
    signal handler) ends it after the current step, with a checkpoint."""

    def __init__(self, run: GRPORun, directory: Path) -> None:
        from transformers import PrinterCallback, ProgressCallback

        self.spec, self.directory = run, Path(directory)
        self.parts = build_trainer(run, self.directory)
        inputs = self.parts.inputs
        self.log = RunLog(
            self.directory,
            inputs.reward,
            inputs.validation,
            max_seconds=run.config.budget.max_seconds,
            max_cpu_seconds=run.config.budget.max_cpu_seconds,
            figures=inputs.figures,
            checkpoint_every=run.config.checkpoint.every,
            checkpoint_keep=run.config.checkpoint.keep,
        )
        trainer = self.parts.trainer
        for noisy in (PrinterCallback, ProgressCallback):  # TRL prints every log as a dict
            trainer.remove_callback(noisy)
        trainer.add_callback(self.log)

    def add_callback(self, callback: Any) -> None:
        """Another ``TrainerCallback`` (a progress bar)."""
        self.parts.trainer.add_callback(callback)

    def run(self, *, resume: bool) -> dict[str, Any]:
        """Train until the budget (from the newest checkpoint with ``resume``); the summary."""
        checkpoint = None
        if resume:
            checkpoint = latest_checkpoint(self.directory / CHECKPOINTS)
            if checkpoint is None:
                raise ResumeError(
                    f"no complete checkpoint in {self.directory / CHECKPOINTS}: the run stopped "
                    "before its first one"
                )
            self.log.restore(checkpoint)
        trainer, hard_stop = self.parts.trainer, False
        try:
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        except KeyboardInterrupt:  # a second Ctrl-C: the last checkpoint stands
            hard_stop = True
        finally:
            self.log.close()
        return self.write_summary(resumed=resume, hard_stop=hard_stop)

    def stop_reason(self, hard_stop: bool) -> str:
        state, limit = self.parts.trainer.state, self.spec.config.budget.max_steps
        if hard_stop or self.log.stop_reason == "interrupted":
            return "interrupted"
        if self.log.stop_reason is not None:
            return self.log.stop_reason
        return "max_steps" if limit is not None and state.global_step >= limit else "epochs"

    def write_summary(self, *, resumed: bool, hard_stop: bool) -> dict[str, Any]:
        """Save the model (unless stopped mid-step) and ``summary.json``; returns the summary."""
        reason = self.stop_reason(hard_stop)
        saved = (
            {} if hard_stop else save_model(self.parts, self.directory, self.spec.lora is not None)
        )
        if self.log.baseline:
            saved["baseline"] = dict(self.log.baseline)
        summary = {
            "status": "interrupted" if reason == "interrupted" else "finished",
            "stop_reason": reason,
            "strategy": self.spec.method,
            "problem": self.parts.label,
            "seed": self.spec.config.seed,
            "steps": self.parts.trainer.state.global_step,
            "samples": self.parts.inputs.reward.samples,
            "best_reward": self.log.best_reward,
            **saved,
            "trainable_parameters": self.parts.trainable,
            "wall_seconds": self.log.wall_seconds(),
            "cpu_seconds": self.log.cpu_seconds(),
            "peak_rss_mib": self.log.peak_rss(),
            "resumed": resumed,
            "run_dir": str(self.directory),
            "esbox_version": esbox.__version__,
        }
        summary = jsonable(summary)
        write_atomic(self.directory / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
        return summary
