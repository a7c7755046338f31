"""One model scored in a fresh process for ``python -m benchmarks rl``: a run's ``model/`` (or
its base model) on a range of its task's held-out questions, with that run's task, agent
settings and dtype, greedy for accuracy and sampled for pass@k; per-question results, so the
parent can pair them across models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import measure


def load_run_config(run_dir: Path) -> dict[str, Any]:
    """The resolved ``config.yaml`` of a run directory."""
    from esbox.runconfig import load_yaml

    return load_yaml(run_dir / "config.yaml")


def score(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: ``run`` (a run directory), ``base`` (score its base model instead), ``start``,
    ``stop`` (held-out questions), ``samples`` (sampled rollouts a question, 0: none),
    ``threads``, ``batch_size``. Returns ``greedy`` (0/1 a question), ``sampled`` (0/1 lists),
    ``figures`` (the evaluation's own, tool use included for agents) and the CPU seconds."""
    import time

    import torch

    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.problems import resolve_model_path
    from esbox.adapters.tasks import load_task

    torch.set_num_threads(int(spec.get("threads", 1)))
    run_dir = Path(spec["run"])
    problem = load_run_config(run_dir)["problem"]
    task = load_task(problem["task"])
    examples = task.heldout[spec["start"] : spec["stop"]]
    model = problem["model"] if spec.get("base") else str(run_dir / "model")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the same device for every model
    loaded, tokenizer = load_model(resolve_model_path(model), dtype=problem["dtype"], device=device)
    backend = HFBackend(loaded, tokenizer)
    start = time.process_time()
    greedy, figures = _rollouts(problem, task, examples, backend, 1, spec)
    sampled: list[list[int]] = []
    if spec["samples"]:
        sampled, sampled_figures = _rollouts(
            problem, task, examples, backend, spec["samples"], spec
        )
        figures.update({k: v for k, v in sampled_figures.items() if k.startswith("pass@")})
    return {
        "greedy": [row[0] for row in greedy],
        "sampled": sampled,
        "figures": figures,
        "cpu_seconds": time.process_time() - start,
        "peak_rss_mib": measure.peak_mib(),
    }


def _rollouts(
    problem: dict[str, Any],
    task: Any,
    examples: list[Any],
    backend: Any,
    samples: int,
    spec: dict[str, Any],
) -> tuple[list[list[int]], dict[str, float]]:
    """Correctness of each question's ``samples`` rollouts (greedy when 1) and the figures."""
    from esbox.adapters.tasks.metrics import score_examples, summarize

    batch_size = int(spec.get("batch_size", 64))
    if problem.get("agent"):
        from esbox.adapters.agents.config import agent_options, build_agent
        from esbox.adapters.agents.evaluator import evaluate_agent, is_correct

        options = agent_options(problem["agent"])
        parts = build_agent(
            options,
            task,
            backend,
            seed=0,
            batch_size=batch_size,
            greedy=samples == 1,
            validation=None,
        )
        figures, trajectories = evaluate_agent(
            parts.evaluator, examples, num_samples=samples, batch_size=batch_size
        )
        correct = [
            [int(is_correct(task, t, e)) for t in ts]  # an environment's own success too
            for ts, e in zip(trajectories, examples, strict=True)
        ]
        return correct, figures
    correct, rewards = score_examples(
        task, backend, examples, num_samples=samples, batch_size=batch_size
    )
    ks = sorted({1 << i for i in range(samples.bit_length())} | {samples})
    as_ints = [[int(c) for c in row] for row in correct]
    return as_ints, {**summarize(correct, rewards, ks=ks), "n": float(len(examples))}


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(score))
