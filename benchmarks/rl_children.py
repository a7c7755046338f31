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
    ``stop`` (held-out questions), ``samples`` (sampled rollouts a question for pass@k, 0:
    none), ``threads``. Returns ``greedy`` (0/1 a question), ``figures`` (``esbox evaluate``'s,
    tool use included for agents, pass@k from the samples) and the CPU seconds."""
    import time

    import torch

    from esbox.adapters.agents.config import agent_options
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.problems import resolve_model_path
    from esbox.adapters.problems.scoring import score_model
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
    agent = agent_options(problem["agent"]) if problem.get("agent") else None
    tokens = None if agent else problem.get("max_new_tokens")  # the runs' answer length
    greedy = score_model(task, examples, backend, agent=agent, max_new_tokens=tokens)
    figures = dict(greedy.figures)
    if spec["samples"]:
        sampled = score_model(
            task, examples, backend, agent=agent, samples=spec["samples"], max_new_tokens=tokens
        )
        figures.update({k: v for k, v in sampled.figures.items() if k.startswith("pass@")})
    return {
        "greedy": [int(c) for c in greedy.correct],
        "figures": figures,
        "cpu_seconds": time.process_time() - start,
        "peak_rss_mib": measure.peak_mib(),
    }


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(score))
