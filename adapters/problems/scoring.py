"""One model on a task's questions, single answers or agent rollouts: what ``esbox evaluate``
reports (accuracy, mean reward, pass@k, the tool-use figures) and each question's correctness,
so that models scored the same way can be compared question by question."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class ModelScore:
    """A model's figures, each question's first-sample correctness and, for agent rollouts, one
    JSON-ready record per trajectory."""

    figures: dict[str, float]
    correct: list[bool]
    records: list[dict[str, Any]] | None = None


def score_model(
    task: Any,
    examples: Sequence[Any],
    backend: Any,
    *,
    agent: Any = None,
    samples: int = 1,
    batch_size: int = 64,
    max_new_tokens: int | None = None,
    progress: Callable[[int], None] | None = None,
    note: Callable[[str], None] | None = None,
    context: str | None = None,
) -> ModelScore:
    """Score the model behind ``backend`` on ``examples`` (greedy with one sample, seeded
    sampling with more: the same for every model); ``agent`` (``AgentOptions``) makes each
    question a tool-use rollout, whose sandbox ``note`` is told of; single answers may read
    ``context`` (a co-evolved context) before each prompt."""
    from .llm import attach_sandbox

    attach_sandbox(task)  # an AHD task scores code: it gets the sandbox it asks for
    if agent is not None:
        if context is not None:
            raise ValueError("scoring an agent with a context is not supported")
        return _agent_score(task, examples, backend, agent, samples, batch_size, progress, note)
    from esbox.adapters.tasks.metrics import pass_ks, score_examples, summarize

    correct, rewards = score_examples(
        task, backend, examples, num_samples=samples, max_new_tokens=max_new_tokens,
        batch_size=batch_size, progress=progress, context=context,
    )  # fmt: skip
    figures = {**summarize(correct, rewards, ks=pass_ks(samples)), "n": float(len(examples))}
    return ModelScore(figures, [bool(c[0]) for c in correct])


def _agent_score(
    task: Any,
    examples: Sequence[Any],
    backend: Any,
    agent: Any,
    samples: int,
    batch_size: int,
    progress: Callable[[int], None] | None,
    note: Callable[[str], None] | None,
) -> ModelScore:
    """The agent rollouts' figures, trajectories and correctness (as the evaluator judged it)."""
    from esbox.adapters.agents.config import build_agent
    from esbox.adapters.agents.evaluator import evaluate_agent, trajectory_records

    parts = build_agent(
        agent, task, backend, seed=0, batch_size=batch_size, greedy=samples == 1,
        validation=None,
    )  # fmt: skip
    loop = parts.evaluator.loop
    for tool in loop.tools.values():
        if hasattr(tool, "sandbox") and note is not None:
            note(f"{tool.name} tool: {tool.sandbox.describe()}")
    figures, trajectories = evaluate_agent(
        parts.evaluator, list(examples), num_samples=samples, batch_size=batch_size,
        progress=progress,
    )  # fmt: skip
    records = trajectory_records(task, parts.evaluator, list(examples), trajectories)
    correct = [bool(r["correct"]) for r in records if r["sample"] == 0]
    return ModelScore(figures, correct, records)
