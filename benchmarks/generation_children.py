"""Generation suite measurements, one per subprocess: one (workload, batch, arm) cell.

``arm`` is ``reused`` (HFBackend as shipped: KV buffers kept across calls, copy-free GQA
attention, glibc's freed memory kept), ``before`` (``reuse_memory=False``: transformers'
growing cache and attention, glibc's defaults) or ``forward`` (one plain batched forward of
the same rows, prompt plus the tokens a row generates, with logits for those tokens: the
limit). ``workload`` is ``arithmetic`` (single-turn, EOS ignored, fixed work) or ``agent``
(examples/agent-math.yaml's tool-math rollouts, greedy, EOS honoured). A warm-up batch of the
cell's shape runs first, so the cell measures the steady state an ES run sees at every
step.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks import measure

ARMS = ("reused", "before", "forward")
WORKLOADS = ("arithmetic", "agent")
AGENT_CONFIG = measure.ROOT / "examples" / "agent-math.yaml"


def setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Model (weights in anonymous memory), backend, the cell's examples and agent options."""
    import torch

    torch.set_num_threads(spec["threads"])
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.tasks import ArithmeticTask, load_task

    model, tokenizer = load_model(Path(spec["model"]).expanduser(), dtype=spec["dtype"])
    with torch.no_grad():  # as after loading onto a device: no zero-copy file mapping
        for param in model.parameters():
            param.data = param.data.clone()
    size = spec["sequences"]
    env: dict[str, Any] = {"model": model, "tokenizer": tokenizer}
    if spec["workload"] == "agent":
        problem = yaml.safe_load(AGENT_CONFIG.read_text())["problem"]
        task = load_task({**problem["task"], "heldout_size": size})
        env.update(task=task, agent=problem["agent"], examples=task.split("heldout")[:size])
    else:
        task = ArithmeticTask(train_size=size, heldout_size=8)
        env.update(task=task, examples=task.split("train")[:size])
    env["backend"] = HFBackend(
        model, tokenizer, reuse_memory=spec["arm"] != "before",
        ignore_eos=spec["workload"] == "arithmetic",
    )  # fmt: skip
    return env


def generate(env: dict[str, Any], spec: dict[str, Any]) -> int:
    """Every example at ``batch`` rows a call; the tokens generated."""
    backend, examples, batch = env["backend"], env["examples"], spec["batch"]
    count = 0
    if spec["workload"] == "agent":
        from esbox.adapters.agents.config import agent_options, build_agent
        from esbox.adapters.agents.evaluator import evaluate_agent

        parts = build_agent(
            agent_options(env["agent"]), env["task"], backend, seed=0, batch_size=batch,
            greedy=True, validation=None,
        )  # fmt: skip
        original = backend.generate

        def counted(*args: Any, **kwargs: Any) -> list[str]:
            nonlocal count
            texts = original(*args, **kwargs)
            count += int(backend.last_stats["new_tokens"])
            return texts

        backend.generate = counted
        try:
            evaluate_agent(parts.evaluator, examples, num_samples=1, batch_size=batch)
        finally:
            del backend.generate
        return count
    for i in range(0, len(examples), batch):
        rows = examples[i : i + batch]
        backend.generate(
            [e.prompt for e in rows], prefills=[e.prefill for e in rows],
            max_new_tokens=spec["new_tokens"],
        )  # fmt: skip
        count += int(backend.last_stats["new_tokens"])
    return count


def forward(env: dict[str, Any], spec: dict[str, Any]) -> int:
    """One batched forward per ``batch`` rows of prompt + the tokens a row may generate
    (``new_tokens``; an agent's ``max_tokens``), with the logits of those positions: what
    decoding computes, without the decoding loop."""
    import torch

    backend, examples, batch = env["backend"], env["examples"], spec["batch"]
    agent = env.get("agent")
    new = agent["max_tokens"] if agent else spec["new_tokens"]
    pad = backend.tokenizer.pad_token_id or 0
    with torch.inference_mode():
        for i in range(0, len(examples), batch):
            rows = [backend.encode(e.prompt, agent["prefill"] if agent else e.prefill)
                    for e in examples[i : i + batch]]  # fmt: skip
            width = max(len(r) for r in rows) + new
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, r in enumerate(rows):
                ids[j, width - new - len(r) : width - new] = torch.tensor(r)
                ids[j, width - new :] = r[-1]
                mask[j, width - new - len(r) :] = 1
            env["model"](input_ids=ids, attention_mask=mask, logits_to_keep=new)
    return len(examples) * new


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """Set up, run one warm-up batch, reset the peak, measure one pass over the examples."""
    if spec["arm"] not in ARMS or spec["workload"] not in WORKLOADS:
        raise ValueError(f"unknown generation cell {spec['arm']!r} / {spec['workload']!r}")
    env = setup(spec)
    run = forward if spec["arm"] == "forward" else generate
    examples, env["examples"] = env["examples"], env["examples"][: spec["batch"]]
    run(env, spec)  # warm-up: one batch of the cell's shape
    env["examples"] = examples
    measure.settle()
    reset = measure.reset_peak()
    before, wall, cpu = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0.0
    tokens = run(env, spec)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    cpu = user + sys_
    return {
        "seconds": wall, "user": user, "sys": sys_, "cpu": cpu, "tokens": tokens,
        "sequences": len(env["examples"]), "faults": after.ru_minflt - before.ru_minflt,
        "peak": measure.peak_mib(), "reset": reset, "loadavg": os.getloadavg()[0],
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(serve))
