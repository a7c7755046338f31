"""LLM overhead measurements, one per subprocess: the set-up (model, prompts, rollout), a timed
ES step per variant with a profile of the space's operations, and the memory runs (plain
inference, an ES step per strategy, one backprop+AdamW step).

The parent (:mod:`benchmarks.llm`) runs ``python -m benchmarks.llm_children --child '<json>'``
through :func:`benchmarks.measure.run_child`; the spec names the child (``kind``: timing,
inference, es_openai_es, es_copes or backprop) and carries the suite's options.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import measure

SIGMA, LEARNING_RATE = 2e-3, 2e-3
STRATEGIES = (("openai_es", {}), ("copes", {"subspaces": 4}))
MEMORY_RUNS = ("inference", *(f"es_{n}" for n, _ in STRATEGIES), "backprop")


# -- shared set-up ---------------------------------------------------------------------------
def setup(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.tasks import ArithmeticTask

    runtime = measure.settle()  # interpreter + torch + transformers, no model yet
    measure.reset_peak()
    # backprop keeps fp32 weights in every case: with --dtype bfloat16 it is the standard
    # mixed-precision recipe (fp32 weights, grads and AdamW state, a bf16 autocast forward)
    dtype = "float32" if args.child == "backprop" else args.dtype
    model, tokenizer = load_model(Path(args.model).expanduser(), dtype=dtype)
    # transformers maps safetensors files zero-copy; give every run the same starting point:
    # the weights resident in ordinary (anonymous) memory, as after loading onto a device.
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
    batch = ArithmeticTask().sample_batch(0, args.prompts)
    backend = HFBackend(model, tokenizer)
    calls = [0]
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def rollout(max_new_tokens: int = args.new_tokens) -> dict[str, float]:
        calls[0] = 0
        wall, cpu = time.perf_counter(), time.process_time()
        backend.generate(
            [e.prompt for e in batch],
            prefills=[e.prefill for e in batch],
            max_new_tokens=max_new_tokens,
            stop=None,
        )
        return {
            "wall": time.perf_counter() - wall,
            "cpu": time.process_time() - cpu,
            "new_tokens": backend.last_stats["new_tokens"],
            "forwards": calls[0],
        }

    return {
        "model": model,
        "tokenizer": tokenizer,
        "batch": batch,
        "backend": backend,
        "rollout": rollout,
        "torch": torch,
        "runtime": runtime,
    }


def strategy(name: str, space: Any, population: int, **options: Any) -> Any:
    import esbox

    return esbox.make_strategy(
        name,
        space,
        seed=0,
        population=population,
        sigma=SIGMA,
        learning_rate=LEARNING_RATE,
        **options,
    )


# -- child: timing ---------------------------------------------------------------------------
VARIANTS = [(name, options, reflect) for name, options in STRATEGIES for reflect in (False, True)]


def variant_label(name: str, options: dict[str, Any], reflect: bool) -> str:
    k = options.get("subspaces")
    return f"{name}{f' K={k}' if k else ''}{', reflect' if reflect else ''}"


def make_space(model: Any, args: argparse.Namespace, reflect: bool = False) -> Any:
    from esbox.adapters.models.space import TorchModuleSpace

    return TorchModuleSpace(
        model,
        noise=args.noise,
        table_size=args.table_size,
        chunk_size=args.chunk_size,
        reflect_antithetic=reflect,
    )


def es_step(space: Any, strat: Any, member_rollout: Any) -> dict[str, Any]:
    """One real ES step: every member's rollout inside one ``space.sweep``, with the sweep's
    own work (backup on entry, writing each member, restore on exit) timed apart from the
    rollouts it brackets, so both sides of the ratio see the same load; then the update."""
    members = strat.ask()
    overhead, rollouts = [], []
    start = time.perf_counter()
    with space.sweep(members) as sweep:
        entered = time.perf_counter()
        overhead.append(entered - start)  # the step's backup
        while True:
            t0 = time.perf_counter()
            if next(sweep, None) is None:
                break
            overhead.append(time.perf_counter() - t0)
            rollouts.append(member_rollout())
        t0 = time.perf_counter()
    overhead.append(time.perf_counter() - t0)  # the restore on exit
    update = strat.tell([float(i % 3) for i in range(len(members))])
    t0 = time.perf_counter()
    space.apply(update)
    return {
        "overhead": sum(overhead),
        "members": len(members),
        "rollouts": rollouts,
        "apply": time.perf_counter() - t0,
        "terms": len(update.terms),
    }


def child_timing(args: argparse.Namespace) -> dict[str, Any]:
    """Per variant, a first ES step with 2-token rollouts (it allocates the space's reused
    buffers and its noise table, once a run) and then the measured steady-state step."""
    env = setup(args)
    rollout, model = env["rollout"], env["model"]
    rollout(2)  # warm-up
    out: dict[str, Any] = {"variants": {}}
    for name, options, reflect in VARIANTS:
        space = make_space(model, args, reflect)
        strat = strategy(name, space, args.population, **options)
        first = es_step(space, strat, partial(rollout, 2))
        step = es_step(space, strat, rollout)
        step["first_overhead"] = first["overhead"]
        out["variants"][variant_label(name, options, reflect)] = step
        out["dimension"] = space.dimension
        del space
    out["profile"] = profile(model, args)
    out["loadavg"] = os.getloadavg()
    return out


def profile(model: Any, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Wall time of each of the space's own operations on the whole model, per strategy."""
    import torch

    result: dict[str, dict[str, float]] = {}
    for name, options in STRATEGIES:
        space = make_space(model, args)
        plus, minus = strategy(name, space, args.population, **options).ask()[:2]
        seconds: dict[str, float] = {}
        operations = [
            ("backup (once a step)", space._ensure_backup),
            (
                "partition (once a step)",
                partial(space._partition.draw, plus.run_seed, plus.step, 4, torch.device("cpu")),
            ),
            ("write a member (noise + add)", partial(space._write, plus)),
            ("write its twin (noise + add)", partial(space._write, minus)),
            ("reflect to the twin instead", space._reflect),
            ("restore (once a sweep)", space._restore),
        ]
        for label, operation in operations:
            if "partition" in label and not options.get("subspaces"):
                continue
            start = time.perf_counter()
            operation()
            seconds[label] = time.perf_counter() - start
        space._backup = None
        result[variant_label(name, options, False)] = seconds
    return result


# -- children: memory ------------------------------------------------------------------------
def child_memory(args: argparse.Namespace) -> dict[str, Any]:
    env = setup(args)
    model, rollout, torch = env["model"], env["rollout"], env["torch"]
    backprop = args.child == "backprop"
    if backprop:
        inputs = training_batch(env, args.new_tokens)
    baseline = measure.settle()
    reset = measure.reset_peak()
    out: dict[str, Any] = {"runtime": env["runtime"], "baseline": baseline, "reset": reset}
    if args.child == "inference":
        out["rollout"] = rollout()
    elif backprop:
        model.train()
        model.requires_grad_(True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out["seconds"] = time.perf_counter() - start
        out["tokens"] = int(inputs["attention_mask"].sum())
    else:
        from esbox.partition import label_dtype, pattern_length

        name = args.child.removeprefix("es_")
        options = dict(STRATEGIES)[name]
        space = make_space(model, args)
        strat = strategy(name, space, args.population, **options)
        members = strat.ask()
        before = measure.rss_mib()
        with space.sweep(members[:2]) as sweep:  # an antithetic pair
            out["backup_measured"] = measure.rss_mib() - before
            out["rollouts"] = [rollout() for _ in sweep]
        update = strat.tell([float(i % 3) for i in range(len(members))])
        space.apply(update)
        out["terms"] = len(update.terms)
        out["backup"] = (
            sum(
                p.numel() * (4 if p.dtype in (torch.bfloat16, torch.float16) else p.element_size())
                for p in model.parameters()
            )
            / measure.MIB
        )
        k = options.get("subspaces", 1)
        pattern = 2 * pattern_length(k, max(c.numel for c in space.chunks))
        out["labels"] = pattern * label_dtype(k).itemsize / measure.MIB if k > 1 else 0.0
    out["peak"] = measure.peak_mib()
    return out


def training_batch(env: dict[str, Any], new_tokens: int) -> dict[str, Any]:
    """The rollout's prompts (template + prefill) plus ``new_tokens`` fixed completion tokens.

    Memory does not depend on the token values; the loss covers the completion tokens only.
    """
    torch, tok, backend = env["torch"], env["tokenizer"], env["backend"]
    filler = tok(" The answer is 42, so the final result is 42." * 8)["input_ids"][:new_tokens]
    rows = [backend.encode(e.prompt, e.prefill) + filler for e in env["batch"]]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), backend._pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        labels[i, len(r) - new_tokens : len(r)] = torch.tensor(filler)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the child ``spec["kind"]`` with the suite's options in the rest of the spec."""
    spec = dict(spec)
    args = argparse.Namespace(child=spec.pop("kind"), **spec)
    if args.child != "timing" and args.child not in MEMORY_RUNS:
        raise ValueError(f"unknown llm child {args.child!r}")
    return child_timing(args) if args.child == "timing" else child_memory(args)


if __name__ == "__main__":
    raise SystemExit(measure.serve_child(serve))
