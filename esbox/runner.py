"""The ES loop: ask -> evaluate under perturbation -> tell -> apply, with budget and checkpoints."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from esbox.checkpoint import (
    HISTORY,
    append_history,
    load_checkpoint,
    read_history,
    remove_partial_writes,
    save_checkpoint,
)
from esbox.errors import ConfigError, ResumeError, RewardError, check_reward_values
from esbox.evaluation import Evaluator
from esbox.space import ParameterSpace
from esbox.strategy import Strategy

Callback = Callable[["Runner", dict[str, Any]], Any]


@dataclass(frozen=True)
class Budget:
    """When to stop: after this many evaluations, steps, wall seconds or CPU seconds of this
    process (whichever comes first)."""

    max_evaluations: int | None = None
    max_steps: int | None = None
    max_seconds: float | None = None
    max_cpu_seconds: float | None = None

    def __post_init__(self) -> None:
        values = {
            "max_evaluations": self.max_evaluations,
            "max_steps": self.max_steps,
            "max_seconds": self.max_seconds,
            "max_cpu_seconds": self.max_cpu_seconds,
        }
        if all(v is None for v in values.values()):
            raise ConfigError(
                "a budget needs max_evaluations, max_steps, max_seconds or max_cpu_seconds"
            )
        for key, value in values.items():
            if value is not None and value <= 0:
                raise ConfigError(f"budget {key} must be > 0, got {value}")


def population_of(strategy: Strategy) -> int:
    """Members per step: the ``population`` option (or the length of ``ask()`` without one)."""
    population = getattr(getattr(strategy, "options", None), "population", None)
    return int(population) if isinstance(population, int) else len(strategy.ask())


def check_budget_fits(max_evaluations: int, population: int) -> None:
    """ConfigError when ``max_evaluations`` cannot pay for a single step of ``population``."""
    if max_evaluations < population:
        raise ConfigError(
            f"budget max_evaluations ({max_evaluations}) is smaller than one step: a step "
            f"evaluates the whole population, so the smallest budget that runs one step is "
            f"{population} (or lower the population)"
        )


@contextmanager
def held_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, then deliver them to the previous handlers.

    ``tell`` + ``apply`` + the counters change together; an interrupt in between would leave a
    half-applied update behind. Outside the main thread signals cannot be caught and pass as is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _: held.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in held:
            handler = previous[sig]
            if callable(handler):
                handler(sig, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), sig)


class Runner:
    """Drives one run; owns the evaluation count, wall time, metrics history and checkpoints.

    A callback ``cb(runner, metrics)`` runs after every step; returning True stops the run.
    Every ``checkpoint_every`` steps (and on Ctrl-C) the full state is written atomically, with
    the state of each callback that has ``state_dict()``/``load_state_dict()``. A step whose
    callbacks an interrupt cut short is checkpointed as such; its callbacks run on resume. A
    callback with ``on_step_evaluated(runner)`` hears, atomically with the step's update, that
    the step's evaluation is complete: what it gathered until then belongs to the step, and
    what comes after (a validation an interrupt may cut short and resume runs again) does not.
    """

    def __init__(
        self,
        space: ParameterSpace,
        strategy: Strategy,
        evaluator: Evaluator,
        budget: Budget,
        *,
        callbacks: Sequence[Callback] = (),
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 0,
        keep_checkpoints: int | None = 3,
        progress: bool = False,
        max_nonfinite_steps: int = 1,
    ) -> None:
        if checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
        if isinstance(max_nonfinite_steps, bool) or not isinstance(max_nonfinite_steps, int):
            raise ConfigError(f"max_nonfinite_steps must be an int, got {max_nonfinite_steps!r}")
        if max_nonfinite_steps < 1:
            raise ConfigError(f"max_nonfinite_steps must be >= 1, got {max_nonfinite_steps}")
        self.max_nonfinite_steps = max_nonfinite_steps
        self._nonfinite_streak = 0
        self.space, self.strategy, self.evaluator, self.budget = space, strategy, evaluator, budget
        plan_budget = getattr(strategy, "plan_budget", None)  # nevergrad plans by the budget
        if plan_budget is not None:
            plan_budget(budget)
        self.callbacks = list(callbacks)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.checkpoint_every = checkpoint_every
        self.keep_checkpoints = keep_checkpoints
        self.progress = progress
        self.evaluations = 0
        self.elapsed = 0.0
        self._cpu_offset, self._cpu_mark = 0.0, None  # the mark is set while ``run`` runs
        self.history: list[dict[str, Any]] = []
        self._history_saved = 0
        self._unfinished: dict[str, Any] | None = None  # a step whose callbacks have not all run
        self.stop_reason: str | None = None

    # -- stopping ------------------------------------------------------------------------------
    def _budget_reason(self) -> str | None:
        b = self.budget
        terminated = getattr(self.strategy, "terminated", None)  # tolx, tolfun...: esbox.restarts
        if terminated:
            return terminated
        if b.max_steps is not None and self.strategy.step >= b.max_steps:
            return "max_steps"
        population = len(self.strategy.ask())
        if b.max_evaluations is not None and self.evaluations + population > b.max_evaluations:
            return "max_evaluations"
        if b.max_seconds is not None and self.elapsed >= b.max_seconds:
            return "max_seconds"
        if b.max_cpu_seconds is not None and self.cpu_seconds() >= b.max_cpu_seconds:
            return "max_cpu_seconds"
        return None

    def cpu_seconds(self) -> float:
        """CPU time of this process (all threads) spent in ``run``, over every resume: steps,
        callbacks such as validation, ``on_start``."""
        running = 0.0 if self._cpu_mark is None else time.process_time() - self._cpu_mark
        return self._cpu_offset + running

    # -- one step ----------------------------------------------------------------------------------
    def step(self) -> dict[str, Any]:
        """One generation; returns its metrics (also appended to ``history``), whose callbacks
        are pending until ``run`` has run them."""
        start = time.perf_counter()
        perturbations = self.strategy.ask()
        rewards = self.evaluator.evaluate(self.space, perturbations)
        self._check_rewards(rewards, len(perturbations))
        with held_signals():
            update = self.strategy.tell(rewards)
            update_norm = self.space.apply(update)
            self.evaluations += len(perturbations)
            self.elapsed += time.perf_counter() - start
            metrics = dict(self.strategy.metrics)
            metrics.update(
                evaluations=self.evaluations, wall_seconds=self.elapsed, update_norm=update_norm
            )
            best = getattr(self.evaluator, "best_value", None)
            if best is not None:
                metrics["best_value"] = best
            self.history.append(metrics)
            self._unfinished = metrics
            for cb in self.callbacks:
                if hasattr(cb, "on_step_evaluated"):
                    cb.on_step_evaluated(self)
        return metrics

    def _check_rewards(self, rewards: Any, population: int) -> None:
        """A non-number is a RewardTypeError; ``max_nonfinite_steps`` steps in a row without a
        single finite reward stop the run with a RewardError (the objective is broken)."""
        check_reward_values(rewards, "the evaluator")
        if np.isfinite(np.asarray(rewards, dtype=np.float64)).any():
            self._nonfinite_streak = 0
            return
        self._nonfinite_streak += 1
        if self._nonfinite_streak >= self.max_nonfinite_steps:
            raise RewardError(
                f"no finite reward in {self._nonfinite_streak} step(s) in a row (last: step "
                f"{self.strategy.step}, all {population} rewards NaN or +-inf): the objective "
                f"never gave a usable number; check that it returns a finite value "
                f"(max_nonfinite_steps, budget.max_nonfinite_steps in a run config, allows more "
                f"such steps)"
            )

    def check_budget(self) -> None:
        """On a fresh run, refuse an evaluation budget smaller than one step (ConfigError)."""
        limit = self.budget.max_evaluations
        if limit is None or self.strategy.step or self.evaluations:
            return
        check_budget_fits(limit, population_of(self.strategy))

    def run(self) -> str:
        """Run until the budget or a callback stops it; returns the stop reason.

        On a fresh run, callbacks with an ``on_start(runner)`` method (e.g. a baseline
        evaluation) are called once before the first step.
        """
        self.check_budget()
        self._cpu_mark = time.process_time()
        try:
            return self._run()
        finally:
            self._cpu_offset, self._cpu_mark = self.cpu_seconds(), None

    def _run(self) -> str:
        if self.strategy.step == 0 and not self.history:
            for cb in self.callbacks:
                if hasattr(cb, "on_start"):
                    cb.on_start(self)
        bar = self._progress_bar()
        try:
            reason = None  # a step cut short before a resume gets its callbacks first
            if self._unfinished is not None and self._finish_step(bar):
                reason = "callback"
            while reason is None and (reason := self._budget_reason()) is None:
                self.step()
                if self._finish_step(bar):
                    reason = "callback"
        except KeyboardInterrupt:
            self.stop_reason = "interrupted"
            if self.checkpoint_dir is not None:
                self.save()
            raise
        finally:
            if bar is not None:
                bar.close()
        self.stop_reason = reason
        if self.checkpoint_dir is not None and self.checkpoint_every:
            self.save()
        return reason

    def _finish_step(self, bar: Any) -> bool:
        """The callbacks and periodic checkpoint of the step that just ended; True to stop."""
        metrics = self._unfinished
        assert metrics is not None
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                best=f"{metrics.get('best_value', metrics['best_reward']):.4g}",
                evals=self.evaluations,
            )
        stop = any([bool(cb(self, metrics)) for cb in self.callbacks])
        self._unfinished = None
        if self.checkpoint_every and self.strategy.step % self.checkpoint_every == 0:
            self.save()
        return stop

    def _progress_bar(self) -> Any:
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=self.budget.max_steps, initial=self.strategy.step, unit="step", dynamic_ncols=True
        )

    # -- checkpoints -------------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors, JSON state) of the whole run."""
        tensors = dict(self.space.state_dict())
        evaluator_state: dict[str, Any] = {}
        if hasattr(self.evaluator, "state_dict"):
            evaluator_state = dict(self.evaluator.state_dict())
            for key, value in evaluator_state.pop("tensors", {}).items():
                tensors[f"evaluator.{key}"] = value
        state = {
            "strategy": self.strategy.state_dict(),
            "evaluator": evaluator_state,
            "runner": {
                "evaluations": self.evaluations,
                "elapsed": self.elapsed,
                "cpu_seconds": self.cpu_seconds(),
                "history_length": len(self.history),
                "callbacks_pending": self._unfinished is not None,
                "nonfinite_streak": self._nonfinite_streak,
            },
            "callbacks": {key: cb.state_dict() for key, cb in self._stateful_callbacks()},
            "next_seeds": self.strategy.peek_seeds(),
        }
        return tensors, state

    def _stateful_callbacks(self) -> list[tuple[str, Any]]:
        """(key, callback) of the callbacks with state: the class name, ``#2``... on repeats."""
        found: list[tuple[str, Any]] = []
        for cb in self.callbacks:
            if hasattr(cb, "state_dict") and hasattr(cb, "load_state_dict"):
                name = type(cb).__name__
                repeats = sum(key.split("#")[0] == name for key, _ in found)
                found.append((f"{name}#{repeats + 1}" if repeats else name, cb))
        return found

    def save(self) -> Path:
        """Write a checkpoint of the current step to ``checkpoint_dir``.

        Signals are held meanwhile, so Ctrl-C never leaves a half-written history line.
        """
        if self.checkpoint_dir is None:
            raise ConfigError("this run has no checkpoint_dir")
        with held_signals():
            tensors, state = self.state()
            if self._history_saved == 0:  # this run owns the file: drop an earlier run's records
                (self.checkpoint_dir / HISTORY).unlink(missing_ok=True)
            append_history(self.checkpoint_dir, self.history[self._history_saved :])
            self._history_saved = len(self.history)
            return save_checkpoint(
                self.checkpoint_dir,
                self.strategy.step,
                tensors,
                state,
                keep=self.keep_checkpoints,
                every=self.checkpoint_every,
            )

    def resume(self, path: str | Path) -> None:
        """Load the newest checkpoint under ``path`` and check the seed stream matches it."""
        path = Path(path)
        root = path.parent if (path / "state.json").is_file() else path
        remove_partial_writes(root)
        tensors, state = load_checkpoint(path)
        self.strategy.load_state_dict(state["strategy"])
        if self.strategy.peek_seeds() != state["next_seeds"]:
            raise ResumeError(
                "the seed stream regenerated from the checkpoint does not match "
                "the recorded one; was it written by another numpy version?"
            )
        self.space.load_state_dict(
            {k: v for k, v in tensors.items() if not k.startswith("evaluator.")}
        )
        if hasattr(self.evaluator, "load_state_dict"):
            evaluator_state = dict(state["evaluator"])
            evaluator_state["tensors"] = {
                k.removeprefix("evaluator."): v
                for k, v in tensors.items()
                if k.startswith("evaluator.")
            }
            self.evaluator.load_state_dict(evaluator_state)
        runner = state["runner"]
        self.evaluations, self.elapsed = int(runner["evaluations"]), float(runner["elapsed"])
        self._nonfinite_streak = int(runner.get("nonfinite_streak", 0))
        self._cpu_offset = _saved_cpu_seconds(runner, root)
        saved = state.get("callbacks", {})  # older checkpoints kept no callback state
        for key, cb in self._stateful_callbacks():
            if key in saved:
                cb.load_state_dict(saved[key])
        length = int(runner["history_length"])
        self.history = read_history(root, length)
        self._history_saved = length
        if runner.get("callbacks_pending", False):  # saved again once its callbacks have run
            self._unfinished = self.history[-1]
            self._history_saved = len(read_history(root, length - 1))

    @property
    def completed_history(self) -> list[dict[str, Any]]:
        """The records of ``history`` whose step has had all its callbacks run."""
        return self.history if self._unfinished is None else self.history[:-1]


def _saved_cpu_seconds(runner_state: dict[str, Any], root: Path) -> float:
    """The CPU seconds a checkpoint recorded; a checkpoint older than that field resumes from
    its last logged ``cpu_seconds`` (LLM runs logged it), else from 0."""
    if "cpu_seconds" in runner_state:
        return float(runner_state["cpu_seconds"])
    rows = read_history(root, int(runner_state["history_length"]))
    return float(rows[-1].get("cpu_seconds") or 0.0) if rows else 0.0
