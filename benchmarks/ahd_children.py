"""The models of one setting of ``python -m benchmarks ahd`` scored in a fresh process: each
arm's trained ``model/`` read after its best context (``best_context.txt``), and the start
model read after the start skill text, greedy on the setting's held-out examples in the
sandbox; one reward and one error (None for none) an example, so the parent can pair them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks import measure
from benchmarks.rl_children import load_run_config


def score(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: ``runs`` (run directories, one task), ``base`` (the start model's skill text:
    it is scored first, from ``problem.model`` of the first run), ``heldout`` (examples),
    ``threads``. Returns ``models``: per model its ``rewards``, ``errors`` and CPU seconds."""
    import torch

    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.problems import resolve_model_path
    from esbox.adapters.problems.llm import load_scored_task
    from esbox.adapters.problems.trained_runs import CONTEXT_FILE
    from esbox.adapters.tasks.metrics import score_examples

    torch.set_num_threads(int(spec.get("threads", 1)))
    runs = [Path(r) for r in spec["runs"]]
    problem = load_run_config(runs[0])["problem"]
    task = load_scored_task(problem["task"])
    examples = task.heldout[: spec["heldout"]]
    models = [(resolve_model_path(problem["model"]), spec["base"])]
    models += [(str(r / "model"), (r / CONTEXT_FILE).read_text().removesuffix("\n")) for r in runs]
    scored = []
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the same device for every model
    for path, context in models:
        loaded, tokenizer = load_model(path, dtype=problem["dtype"], device=device)
        start = time.process_time()
        task.attempts = []  # one record a completion, in the examples' order
        score_examples(
            task, HFBackend(loaded, tokenizer), examples, context=context,
            max_new_tokens=problem.get("max_new_tokens") or None,
        )  # fmt: skip
        scored.append({
            "rewards": [a["reward"] for a in task.attempts],
            "errors": [a["error"] for a in task.attempts],
            "cpu_seconds": time.process_time() - start,
        })  # fmt: skip
    return {"models": scored}


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(score))
