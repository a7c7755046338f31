"""Agent rollouts behind the evaluator interface: each member's reward is the mean trajectory
reward over the step's shared minibatch, with tool-use metrics and sampled trajectories logged.

The reward of a trajectory is the task's reward of its final answer (or its environment's
reward, when it plays one that scores: the task's ``environment_factory`` or
``problem.agent.environment``; every member of a step plays the same episodes), minus
``invalid_call_penalty`` per malformed call and ``truncation_penalty`` when it ran out of turns
or tokens. Rewards, co-evolved contexts (ESOpt) and greedy common random numbers work as in
:class:`~esbox.adapters.tasks.rollouts.RolloutEvaluator`, which this evaluator extends.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esbox.adapters.models.batched import LowRankPopulation
from esbox.adapters.models.space import TorchModuleSpace
from esbox.adapters.tasks.base import Example, Task
from esbox.adapters.tasks.batched_rollouts import BatchedRolloutEvaluator
from esbox.adapters.tasks.metrics import pass_ks
from esbox.adapters.tasks.metrics import summarize as summarize_correct
from esbox.adapters.tasks.rollouts import HeldoutValidation
from esbox.space import ParameterSpace
from esbox.specs import Perturbation

from .episodes import Episode
from .loop import AgentLoop, Trajectory


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Tool-use figures of a set of trajectories (rates in [0, 1], means per trajectory)."""
    n = max(len(trajectories), 1)
    calls = sum(t.calls for t in trajectories)
    return {
        "tool_call_rate": sum(t.calls > 0 for t in trajectories) / n,
        "valid_call_rate": sum(t.valid_calls for t in trajectories) / calls if calls else 0.0,
        "tool_errors": float(sum(t.tool_errors for t in trajectories)),
        "turns": sum(t.turns for t in trajectories) / n,
        "trajectory_tokens": sum(t.tokens for t in trajectories) / n,
        "answer_rate": sum(t.stop in ("answer", "done") for t in trajectories) / n,
        **_environment_figures(trajectories),
    }


def _environment_figures(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The environment's mean reward and its errors, where trajectories played one."""
    played = [t for t in trajectories if t.env_reward is not None or t.env_errors]
    if not played:
        return {}
    scored = [t.env_reward for t in played if t.env_reward is not None]
    return {
        "env_reward": float(np.mean(scored)) if scored else 0.0,
        "env_errors": float(sum(t.env_errors for t in played)),
    }


def episode_row(example: Example) -> dict[str, Any]:
    """What an environment is reset from: the example's columns (its meta), its prompt and
    answer, like the dataset row TRL passes to ``reset``."""
    return {**example.meta, "prompt": example.prompt, "answer": example.answer}


def is_correct(task: Task, trajectory: Trajectory, example: Example) -> bool:
    """A trajectory's success: its environment's full reward when it played one that scores,
    else the task's check of the final answer."""
    if trajectory.env_reward is not None:
        return trajectory.env_reward >= 1.0
    return bool(task.is_correct(trajectory.final or "", example))


class TrajectoryLog:
    """Appends trajectories to a JSONL file; a step written again replaces the lines of that step
    and later ones, so the file matches the run. A checkpoint keeps its ``size()``; a resume
    ``truncate``s it back to that, dropping what a killed run wrote later (a torn line too)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.last_step = max((step for _, step in self._lines()), default=-1)

    def _lines(self) -> list[tuple[str, int]]:
        """(line, step) of each complete record; a line torn by a kill is left out."""
        if not self.path.is_file():
            return []
        found = []
        for line in self.path.read_text(encoding="utf-8").split("\n"):  # not at U+2028
            try:
                found.append((line, int(json.loads(line)["step"])))
            except (ValueError, KeyError, TypeError):
                continue
        return found

    def size(self) -> int:
        """The file's length in bytes (0 before the first write)."""
        return self.path.stat().st_size if self.path.is_file() else 0

    def truncate(self, size: int) -> None:
        """Cut the file back to its first ``size`` bytes (a checkpoint's ``size()``)."""
        if self.size() > size:
            os.truncate(self.path, size)
            self.last_step = max((step for _, step in self._lines()), default=-1)

    def write(self, step: int, records: Sequence[dict[str, Any]]) -> None:
        if step <= self.last_step:
            kept = [line for line, logged in self._lines() if logged < step]
            self.path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        with self.path.open("a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps({"step": step, **record}, ensure_ascii=False) + "\n")
        self.last_step = step


class AgentEvaluator(BatchedRolloutEvaluator):
    """Mean trajectory reward of each member; ``log_per_member`` trajectories of every member go
    to ``log`` each step, and :meth:`add_metrics` (a runner callback) adds the step's figures.

    A low-rank population on the transformers backend runs all members' trajectories in shared
    generation calls (``max_rows`` rows a call at most, as in ``BatchedRolloutEvaluator``);
    any other population is swept one member at a time."""

    def __init__(
        self,
        task: Task,
        loop: AgentLoop,
        *,
        batch_size: int = 16,
        seed: int = 0,
        greedy: bool = True,
        temperature: float = 1.0,
        invalid_call_penalty: float = 0.0,
        truncation_penalty: float = 0.0,
        log: TrajectoryLog | None = None,
        log_per_member: int = 1,
        context_of: Any = None,
        max_rows: int = 0,
        environment: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(
            task, loop.backend, batch_size=batch_size, seed=seed, greedy=greedy,
            context_of=context_of, max_rows=max_rows,
        )  # fmt: skip
        self.loop, self.temperature = loop, temperature
        self.invalid_call_penalty = invalid_call_penalty
        self.truncation_penalty = truncation_penalty
        self.log, self.log_per_member = log, log_per_member
        self._step_trajectories: list[Trajectory] = []
        self._figures: dict[str, float] = summarize([])
        self._records: list[dict[str, Any]] = []
        # a callable giving a fresh environment per trajectory (TRL's environment_factory)
        self.environment = environment or getattr(task, "environment_factory", None)
        probe = Episode(self.environment(), {}) if self.environment is not None else None
        self.tools = loop.toolbox(probe)  # every trajectory's tools (probed once, as TRL does)

    def trajectory_reward(self, trajectory: Trajectory, example: Example) -> float:
        """The environment's reward (else the task's reward of the final answer), less the
        protocol penalties; NaN if it fails."""
        if trajectory.env_reward is not None:
            value = trajectory.env_reward
        else:
            value = self._reward(trajectory.final or "", example)
        value -= self.invalid_call_penalty * trajectory.invalid_calls
        if trajectory.stop not in ("answer", "done"):
            value -= self.truncation_penalty
        return value if math.isfinite(value) else math.nan

    def run(self, batch: Sequence[Example], step: int, context: int | None) -> list[Trajectory]:
        """The trajectories of the model as it is now on ``batch``, rewards filled in."""
        return self._run(batch, step, self._conversations(batch, context))

    def _conversations(self, batch: Sequence[Example], context: int | None) -> list[Any]:
        conversations = self._prompts(batch, context)
        if any(isinstance(c, str) for c in conversations):
            raise ValueError("agent rollouts need chat prompts (the task's chat=True)")
        return conversations

    def _run(
        self, batch: Sequence[Example], step: int, conversations: list[Any], groups: int = 1
    ) -> list[Trajectory]:
        """Trajectories of ``conversations`` (``groups`` copies of ``batch``, group-major) with
        their rewards."""
        examples = list(batch) * groups
        episodes = None
        if self.environment is not None:  # one fresh environment per trajectory, reset from its row
            episodes = [Episode(self.environment(), episode_row(e)) for e in examples]
        trajectories = self.loop.run(
            conversations,
            greedy=self.greedy,
            temperature=self.temperature,
            seed=None if self.greedy else self.seed * 1_000_003 + step,
            groups=groups,
            episodes=episodes,
        )
        for k, (trajectory, example) in enumerate(zip(trajectories, examples, strict=True)):
            if episodes is not None:
                failed = episodes[k].error is not None
                trajectory.env_reward = episodes[k].score()
                trajectory.env_errors += int(not failed and episodes[k].error is not None)
            trajectory.reward = self.trajectory_reward(trajectory, example)
        return trajectories

    def _population(
        self, batch: Sequence[Example], step: int, perturbations: Sequence[Perturbation]
    ) -> list[list[Trajectory]]:
        """Every member's trajectories on ``batch`` in shared generation calls (the low-rank
        population is open): member-major groups of rows, ``max_rows`` rows a call at most."""
        size = len(perturbations)
        per_call = self.prompts_per_call(size, len(batch))
        per_member: list[list[Trajectory]] = [[] for _ in perturbations]
        for lo in range(0, len(batch), per_call):
            part = batch[lo : lo + per_call]
            conversations = [c for p in perturbations for c in self._conversations(part, p.context)]
            trajectories = self._run(part, step, conversations, groups=size)
            for i in range(size):
                per_member[i] += trajectories[i * len(part) : (i + 1) * len(part)]
        return per_member

    def evaluate(self, space: ParameterSpace, perturbations: Sequence[Perturbation]) -> np.ndarray:
        step = perturbations[0].step
        batch = self.task.sample_batch(step, self.batch_size, self.seed)
        if self.batches(space, perturbations):
            assert isinstance(space, TorchModuleSpace)
            with LowRankPopulation(space, perturbations):
                per_member = self._population(batch, step, perturbations)
        else:
            with space.sweep(perturbations) as members:
                per_member = [self.run(batch, step, p.context) for p in members]
        self._step_trajectories = [t for ts in per_member for t in ts]
        self._figures = summarize(self._step_trajectories)
        self._records = [
            {"member": i, "seed": p.seed, "scale": p.scale, "context": p.context,
             "question": _question(batch[j]), "gold": batch[j].answer,
             "system": self.loop.system_text(t.messages, self.tools), **t.to_dict()}
            for i, (p, ts) in enumerate(zip(perturbations, per_member, strict=True))
            for j, t in enumerate(ts[: self.log_per_member])
        ]  # fmt: skip
        if self.log is not None:
            self.log.write(step, self._records)
        return np.array([np.mean([t.reward for t in ts]) for ts in per_member])

    def add_metrics(self, runner: Any, metrics: dict[str, Any]) -> None:
        """Runner callback: the step's tool-use figures as ``agent_*`` metrics."""
        metrics.update({f"agent_{k}": v for k, v in self._figures.items()})

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the step's figures (``add_metrics`` of a step an interrupt
        cut short runs on resume) and the trajectory log's size."""
        return {"figures": self._figures, "log_size": self.log.size() if self.log else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``; the trajectory log drops what was written after it."""
        self._figures = dict(state.get("figures", self._figures))
        if self.log is not None and state.get("log_size") is not None:
            self.log.truncate(int(state["log_size"]))


class AgentValidation(HeldoutValidation):
    """Held-out figures of agent rollouts: accuracy, mean reward and the tool-use rates."""

    def __init__(self, task: Task, evaluator: AgentEvaluator, **options: Any) -> None:
        super().__init__(task, evaluator.backend, **options)
        self.evaluator = evaluator

    def measure(self, context: str | None = None) -> dict[str, float]:
        """Held-out agent rollouts; an agent run validates without a context (the config check
        refuses ``validation_context: best`` with an agent)."""
        if context is not None:
            raise ValueError("agent validation reads no context")
        examples = self.task.heldout[: self.limit]
        figures, _ = evaluate_agent(self.evaluator, examples, batch_size=self.batch_size)
        return {f"val_{k}": v for k, v in figures.items()}


def evaluate_agent(
    evaluator: AgentEvaluator,
    examples: Sequence[Example],
    *,
    num_samples: int = 1,
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, float], list[list[Trajectory]]]:
    """Agent rollouts of the model as it is on ``examples``, ``num_samples`` each (sampled unless
    the evaluator is greedy; no two turns of two samples share a seed), ``batch_size``
    conversations at a time.

    Returns the figures — accuracy (first sample), mean reward, pass@k for k = 1, 2, 4, ... up to
    ``num_samples``, ``n`` and the tool-use figures of :func:`summarize` over every trajectory —
    and the trajectories of each example. ``progress`` gets the questions of each finished batch.
    """
    if not examples:
        raise ValueError("no questions to score")
    task = evaluator.task
    per_example: list[list[Trajectory]] = [[] for _ in examples]
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        for sample in range(num_samples):  # the loop seeds turn k of a sample's "step" + k
            step = sample * evaluator.loop.limits.max_turns
            for j, t in enumerate(evaluator.run(chunk, step, None)):
                per_example[i + j].append(t)
        if progress is not None:
            progress(len(chunk))
    pairs = list(zip(per_example, examples, strict=True))
    correct = [[is_correct(task, t, e) for t in ts] for ts, e in pairs]
    rewards = [[t.reward for t in ts] for ts in per_example]
    ranked = summarize_correct(correct, ks=pass_ks(num_samples))
    figures = {
        "accuracy": ranked.pop("accuracy"),
        "mean_reward": float(np.nanmean(rewards)) if np.isfinite(rewards).any() else math.nan,
        **ranked,
        "n": float(len(examples)),
        **summarize([t for ts in per_example for t in ts]),
    }
    return figures, per_example


def trajectory_records(
    task: Task,
    loop: AgentLoop | AgentEvaluator,
    examples: Sequence[Example],
    trajectories: Sequence[Sequence[Trajectory]],
) -> list[dict[str, Any]]:
    """One JSON-ready record per trajectory of :func:`evaluate_agent`: the question, its gold
    answer, whether the final answer is right, the system prompt and the trajectory (``loop``:
    the evaluator, for the tools of its environment)."""
    tools = getattr(loop, "tools", None) if isinstance(loop, AgentEvaluator) else None
    loop = loop.loop if isinstance(loop, AgentEvaluator) else loop
    return [
        {"index": j, "sample": s, "question": _question(example), "gold": example.answer,
         "correct": is_correct(task, t, example),
         "system": loop.system_text(t.messages, tools), **t.to_dict()}
        for j, (example, ts) in enumerate(zip(examples, trajectories, strict=True))
        for s, t in enumerate(ts)
    ]  # fmt: skip


def _question(example: Example) -> str:
    prompt = example.prompt
    return prompt if isinstance(prompt, str) else str(prompt[-1]["content"])
