"""Low-rank suite measurements, one per subprocess: one ES step or one plain batched inference.

``kind`` picks the child: ``inference`` (one ``generate`` of the same N x B rows, no ES),
``lowrank`` (an OpenAI-ES step with ``perturbation: lowrank``: all members in batched
forwards through ``BatchedRolloutEvaluator``, then the update by replay) or ``fullrank`` (the
same step with full-rank noise: the sweep writes each member and generates its B rows);
``learn`` is a timed run of the shipped arithmetic config in either mode.
Every row generates exactly ``new_tokens`` tokens (EOS ignored), so the three do the same
decoding work. The peak RSS counter is reset after the model is loaded and warmed up.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks import measure

MODES = ("inference", "lowrank", "fullrank")
SIGMA, LEARNING_RATE = 2e-3, 2e-3


def setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Model (weights in anonymous memory), backend that ignores EOS, the step's prompts."""
    import torch

    torch.set_num_threads(spec["threads"])
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.tasks import ArithmeticTask

    model, tokenizer = load_model(Path(spec["model"]).expanduser(), dtype=spec["dtype"])
    with torch.no_grad():  # as after loading onto a device: no zero-copy file mapping
        for param in model.parameters():
            param.data = param.data.clone()
    task = ArithmeticTask(train_size=max(64, spec["prompts"]), heldout_size=8)
    backend = HFBackend(model, tokenizer, ignore_eos=True)
    return {"model": model, "backend": backend, "task": task}


def step(env: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """One timed ES step (evaluate every member, tell, apply) in mode ``spec['kind']``."""
    import esbox
    from esbox.adapters.models.space import TorchModuleSpace
    from esbox.adapters.tasks.batched_rollouts import BatchedRolloutEvaluator

    lowrank = spec["kind"] == "lowrank"
    space = TorchModuleSpace(env["model"])
    options = {"perturbation": "lowrank", "rank": spec["rank"]} if lowrank else {}
    strategy = esbox.make_strategy(
        "openai_es", space, seed=0, population=spec["population"], sigma=SIGMA,
        learning_rate=LEARNING_RATE, **options,
    )  # fmt: skip
    # full rank: the same evaluator falls back to the sweep (one member at a time)
    evaluator = BatchedRolloutEvaluator(
        env["task"], env["backend"], batch_size=spec["prompts"],
        max_new_tokens=spec["new_tokens"], max_rows=spec.get("max_rows", 0),
    )  # fmt: skip
    members = strategy.ask()
    start, cpu = time.perf_counter(), time.process_time()
    rewards = evaluator.evaluate(space, members)
    evaluated = time.perf_counter()
    space.apply(strategy.tell(rewards))
    return {
        "evaluate": evaluated - start,
        "apply": time.perf_counter() - evaluated,
        "seconds": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
        "batched": evaluator.batches(space, members),
    }


def inference(env: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Plain batched generation of the same N x B rows (the step's prompts, N times)."""
    batch = env["task"].sample_batch(0, spec["prompts"])
    rows = [e for _ in range(spec["population"]) for e in batch]
    start, cpu = time.perf_counter(), time.process_time()
    env["backend"].generate(
        [e.prompt for e in rows], prefills=[e.prefill for e in rows],
        max_new_tokens=spec["new_tokens"],
    )  # fmt: skip
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu}


def learn(spec: dict[str, Any]) -> dict[str, Any]:
    """A run of the shipped arithmetic config (``examples/llm-arith.yaml``: CoPES K = 4, N = 16)
    for ``seconds`` of steps, full- or low-rank; held-out accuracy against step seconds."""
    from esbox.adapters.problems import load_run

    rank = [f"options.perturbation={spec['perturbation']}", f"options.rank={spec['rank']}"]
    session = load_run(
        measure.ROOT / "examples" / "llm-arith.yaml",
        overrides=[
            f"seed={spec['seed']}", "budget.max_steps=10000",
            f"budget.max_seconds={spec['seconds']}", f"problem.validation_every={spec['every']}",
            f"problem.validation_limit={spec['heldout']}", f"problem.threads={spec['threads']}",
            "checkpoint.every=0", f"output.dir={spec['out']}", *rank,
        ],
    )  # fmt: skip
    runner = session.runner()
    runner.run()
    check = next(c for c in session.problem.callbacks if hasattr(c, "baseline"))
    curve = [(0.0, check.baseline["val_accuracy"])] + [
        (m["wall_seconds"], m["val_accuracy"]) for m in runner.history if "val_accuracy" in m
    ]
    if "val_accuracy" not in runner.history[-1]:  # the weights the budget ended with
        curve.append((runner.history[-1]["wall_seconds"], check.measure()["val_accuracy"]))
    return {"steps": len(runner.history), "curve": curve}


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement: set up, warm up, reset the peak, measure."""
    if spec["kind"] == "learn":
        return learn(spec)
    if spec["kind"] not in MODES:
        raise ValueError(f"unknown lowrank child {spec['kind']!r}")
    env = setup(spec)
    env["backend"].generate(["1 + 1 ="], max_new_tokens=2)  # thread pools, first allocations
    baseline = measure.settle()
    reset = measure.reset_peak()
    out = inference(env, spec) if spec["kind"] == "inference" else step(env, spec)
    out.update(
        baseline=baseline, peak=measure.peak_mib(), reset=reset, loadavg=os.getloadavg()[0],
        rows=spec["population"] * spec["prompts"],
    )  # fmt: skip
    return out


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(serve))
