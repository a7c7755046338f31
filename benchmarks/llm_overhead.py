"""LLM overhead of ES on the shipped model: perturb+restore time against a rollout, and peak RSS
of an ES step against plain inference and one backprop step.

1. Time: one member's ``with space.perturbed(p): pass`` cycle (openai_es, and copes K=4) as a
   fraction of one member's rollout (16 ArithmeticTask prompts x 32 new tokens, greedy,
   HFBackend, no stop string), plus a per-operation breakdown of the cycle and what-if timings
   of cheaper variants. Target: at most 5%.
2. Memory: peak RSS of an ES step (perturb + rollout + restore + apply of a 16-term update), of
   the same rollout without ES, and of one forward+backward+AdamW step on the same prompts plus
   32 tokens. Each runs in its own subprocess; the peak counter is reset after the model is
   loaded. Targets: ES <= 1.1x inference (host backup reported separately), <= 1/4 backprop.

    python benchmarks/llm_overhead.py --model /work/models/smollm2-135m-instruct

Read the numbers as ratios within one run: absolute times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MIB = float(1 << 20)
SIGMA, LEARNING_RATE = 2e-3, 2e-3
STRATEGIES = (("openai_es", {}), ("copes", {"subspaces": 4}))
DEFAULT_MODEL = "~/.cache/esbox/models/smollm2-135m-instruct"


# -- memory probes ---------------------------------------------------------------------------
def _status_kib(key: str) -> int | None:
    with contextlib.suppress(OSError), open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def rss_mib() -> float:
    kib = _status_kib("VmRSS")
    return kib / 1024 if kib is not None else peak_mib()


def peak_mib() -> float:
    """Peak RSS since the last reset (VmHWM), else since start (ru_maxrss)."""
    kib = _status_kib("VmHWM")
    if kib is None:
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kib = kib / 1024 if sys.platform == "darwin" else kib
    return kib / 1024


def settle_and_reset() -> tuple[float, bool]:
    """Free start-up garbage, reset the peak counter; returns (current RSS, reset worked)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        reset = True
    except OSError:
        reset = False
    return rss_mib(), reset


# -- shared set-up ---------------------------------------------------------------------------
def setup(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.tasks import ArithmeticTask

    runtime = settle_and_reset()[0]  # interpreter + torch + transformers, no model yet
    model, tokenizer = load_model(Path(args.model).expanduser(), dtype="float32")
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
def child_timing(args: argparse.Namespace) -> dict[str, Any]:
    """Per strategy: step 0 times bare ``perturbed(p): pass`` cycles; step 1 is a real ES step
    whose perturb and restore are timed around each member's rollout (paired, same load)."""
    from esbox.adapters.torch_space import TorchModuleSpace

    env = setup(args)
    rollout, model = env["rollout"], env["model"]
    rollout(2)  # warm-up
    space = TorchModuleSpace(model, noise=args.noise)
    out: dict[str, Any] = {"dimension": space.dimension, "strategies": {}}
    clocks = (time.perf_counter, time.process_time)
    for name, options in STRATEGIES:
        strat = strategy(name, space, args.population, **options)
        bare, paired, rollouts, applies = [], [], [], []
        for step in range(2):
            members = strat.ask()
            for p in members:
                t0 = [c() for c in clocks]
                with space.perturbed(p):
                    t1 = [c() for c in clocks]
                    if step:
                        rollouts.append(rollout())
                    t2 = [c() for c in clocks]
                t3 = [c() for c in clocks]
                cost = [b - a + d - c for a, b, c, d in zip(t0, t1, t2, t3, strict=True)]
                (paired if step else bare).append(cost)
            update = strat.tell([float(i % 3) for i in range(len(members))])
            start = time.perf_counter()
            space.apply(update)
            applies.append((time.perf_counter() - start, len(update.terms)))
        out["strategies"][name] = {
            "bare": bare, "paired": paired, "rollouts": rollouts, "applies": applies,
        }  # fmt: skip
    out["profile"] = profile(model, args)
    out["loadavg"] = os.getloadavg()
    return out


class Stopwatch:
    """Accumulated wall time per label: ``with watch("add"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, label: str) -> Any:
        start = time.perf_counter()
        yield
        self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start


def profile(model: Any, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per-operation wall time of one member's perturb+restore, replaying space.py's steps.

    Rows starting with ``~`` are what-ifs (cheaper variants), not part of the cycle.
    """
    import torch

    from esbox.adapters.torch_space import select_parameters
    from esbox.noise import chunk_generator, derive_seed
    from esbox.partition import chunk_labels
    from esbox.space import DEFAULT_CHUNK_SIZE, chunk_layout

    flats = [p.detach().view(-1) for _, p in select_parameters(model)]
    chunks = chunk_layout([f.numel() for f in flats], DEFAULT_CHUNK_SIZE)
    buf = torch.empty(max(c.numel for c in chunks))
    table = torch.randn(1 << 25, generator=torch.Generator().manual_seed(0))
    result: dict[str, dict[str, float]] = {}
    for k in (1, 4):
        watch = Stopwatch()
        with watch("backup (once a step)"):
            refs = [f.clone() for f in flats]
        labels = {}
        for c in chunks if k > 1 else ():
            with watch("partition labels (once a step)"):
                labels[c] = chunk_labels(
                    0, 0, k, c.tensor_index, c.chunk_index, c.numel, c.global_start
                ).to(torch.uint8)
        scale = SIGMA * k**0.5
        for c in chunks:
            ref = refs[c.tensor_index][c.start : c.stop]
            target = flats[c.tensor_index][c.start : c.stop]
            with watch("seed + generator"):
                seed = derive_seed(0, 0, 12345, c.tensor_index, c.chunk_index)
                gen = chunk_generator(seed, "cpu")
            with watch("noise normal_"):
                eps = buf[: c.numel].normal_(generator=gen)
            if k > 1:
                with watch("~fused mask: addcmul(ref, eps, labels == k)"):
                    torch.addcmul(ref, eps, labels[c] == 1, value=scale, out=target)
                with watch("subspace mask (labels == k, mul_)"):
                    eps.mul_(labels[c] == 1)
            with watch("scale mul_"):
                eps.mul_(scale)
            with watch("add (ref + delta, out=weights)"):
                torch.add(ref, eps, out=target)
            with watch("~fused add(ref, eps, alpha=scale)"):
                torch.add(ref, eps, alpha=scale, out=target)
            with watch("~antithetic twin: lerp(x, ref, 2)"):
                torch.lerp(target, ref, 2.0, out=target)
            offset = c.global_start % (table.numel() - c.numel)
            with watch("~noise-table add (no RNG)"):
                torch.add(ref, table[offset : offset + c.numel], alpha=scale, out=target)
        for flat, ref in zip(flats, refs, strict=True):
            with watch("restore copy_"):
                flat.copy_(ref)
        result[f"K={k}"] = watch.seconds
    return result


# -- children: memory ------------------------------------------------------------------------
def child_memory(args: argparse.Namespace) -> dict[str, Any]:
    env = setup(args)
    model, rollout, torch = env["model"], env["rollout"], env["torch"]
    backprop = args.child == "backprop"
    if backprop:
        inputs = training_batch(env, args.new_tokens)
    baseline, reset = settle_and_reset()
    out: dict[str, Any] = {"runtime": env["runtime"], "baseline": baseline, "reset": reset}
    if args.child == "inference":
        out["rollout"] = rollout()
    elif backprop:
        model.train()
        model.requires_grad_(True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        start = time.perf_counter()
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out["seconds"] = time.perf_counter() - start
        out["tokens"] = int(inputs["attention_mask"].sum())
    else:
        from esbox.adapters.torch_space import TorchModuleSpace

        name = args.child.removeprefix("es_")
        options = dict(STRATEGIES)[name]
        space = TorchModuleSpace(model, noise=args.noise)
        strat = strategy(name, space, args.population, antithetic=False, **options)
        members = strat.ask()
        before = rss_mib()
        with space.perturbed(members[0]):
            out["backup_measured"] = rss_mib() - before
            out["rollout"] = rollout()
        update = strat.tell([float(i % 3) for i in range(len(members))])
        space.apply(update)
        out["terms"] = len(update.terms)
        out["backup"] = (
            sum(
                p.numel() * (4 if p.dtype in (torch.bfloat16, torch.float16) else p.element_size())
                for p in model.parameters()
            )
            / MIB
        )
        out["labels"] = space.dimension / MIB if options.get("subspaces", 1) > 1 else 0.0
    out["peak"] = peak_mib()
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


# -- parent ----------------------------------------------------------------------------------
def run_child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--model",
        args.model,
        "--threads",
        str(args.threads),
        "--prompts",
        str(args.prompts),
        "--new-tokens",
        str(args.new_tokens),
        "--population",
        str(args.population),
        "--noise",
        args.noise,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"child {mode} failed:\n{proc.stderr[-3000:]}")
    print(f"  {mode}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return json.loads(lines[-1][len("RESULT ") :])


def met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def report(timing: dict[str, Any], memory: dict[str, dict[str, Any]], args) -> str:
    n = args.population
    first = next(iter(timing["strategies"].values()))["rollouts"]
    lines = [
        f"Rollout: {args.prompts} prompts x max {args.new_tokens} new tokens, greedy, no stop "
        f"string; {first[0]['forwards']} forward passes each; tokens before EOS: "
        f"{min(r['new_tokens'] for r in first):.0f}-{max(r['new_tokens'] for r in first):.0f} "
        f"a rollout. d = {timing['dimension']:,} fp32 weights, {args.threads} threads, load "
        f"average at the end {timing['loadavg'][0]:.1f}.",
        "",
        "| strategy | rollout a member (mean) | perturb+restore a member, in the step "
        "| fraction of the rollout, wall (CPU) | target <= 5% | bare `pass` cycle (mean, median) "
        "| apply a step (terms) |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for name, s in timing["strategies"].items():
        roll = [statistics.mean(r[k] for r in s["rollouts"]) for k in ("wall", "cpu")]
        cost = [statistics.mean(c[k] for c in s["paired"]) for k in (0, 1)]
        frac = cost[0] / roll[0]
        bare = [c[0] for c in s["bare"]]
        applies = ", ".join(f"{t:.2f} s ({k})" for t, k in s["applies"])
        lines.append(
            f"| {name} (N={n}) | {roll[0]:.2f} s | {cost[0]:.3f} s | {frac:.1%} "
            f"({cost[1] / roll[1]:.1%}) | {met(frac <= 0.05)} | {statistics.mean(bare):.3f} s, "
            f"{statistics.median(bare):.3f} s | {applies} |"
        )
    lines += [
        "",
        "Where one member's cycle goes (wall s; `~` rows are what-ifs, not in the cycle):",
        "",
        "| operation | openai_es (K=1) | copes (K=4) |",
        "|---|---:|---:|",
    ]
    p1, p4 = timing["profile"]["K=1"], timing["profile"]["K=4"]
    for op in dict.fromkeys([*p1, *p4]):
        lines.append(f"| {op} | {p1.get(op, 0):.3f} | {p4.get(op, 0):.3f} |")
    tot = [
        sum(v / (n if "once" in k else 1) for k, v in q.items() if not k.startswith("~"))
        for q in (p1, p4)
    ]
    lines.append(
        f"| cycle total (without ~ rows; once-a-step rows / N) | {tot[0]:.3f} | {tot[1]:.3f} |"
    )
    inf, bp = memory["inference"], memory["backprop"]
    lines += [
        "",
        "| run (own subprocess) | runtime RSS (no model) | RSS with model | peak RSS "
        "| peak - RSS with model | notes |",
        "|---|---:|---:|---:|---:|---|",
    ]

    def row(label: str, m: dict[str, Any], notes: str) -> str:
        return (
            f"| {label} | {m['runtime']:.0f} MiB | {m['baseline']:.0f} MiB | "
            f"{m['peak']:.0f} MiB | {m['peak'] - m['baseline']:.0f} MiB | {notes} |"
        )

    lines.append(row("plain inference", inf, "the same rollout, no ES"))
    es_rows = [memory[f"es_{name}"] for name, _ in STRATEGIES]
    for (name, _), m in zip(STRATEGIES, es_rows, strict=True):
        notes = (
            f"host backup {m['backup']:.0f} MiB (RSS rose {m['backup_measured']:.0f} MiB on "
            f"entering perturbed), labels {m['labels']:.0f} MiB, {m['terms']} update terms"
        )
        lines.append(row(f"ES step, {name}", m, notes))
    lines.append(row("backprop step (AdamW)", bp, f"{bp['tokens']} tokens, {bp['seconds']:.1f} s"))
    lines += ["", "| ratio | openai_es | copes K=4 | target | met |", "|---|---:|---:|---|---|"]
    ratios = [
        ("ES peak / inference peak", lambda m: m["peak"] / inf["peak"], 1.1),
        ("(ES peak - host backup) / inference peak",
         lambda m: (m["peak"] - m["backup"]) / inf["peak"], 1.1),
        ("ES peak / backprop peak", lambda m: m["peak"] / bp["peak"], 0.25),
        ("(ES peak - host backup) / backprop peak",
         lambda m: (m["peak"] - m["backup"]) / bp["peak"], 0.25),
        ("same, without the runtime RSS: (ES - runtime) / (backprop - runtime)",
         lambda m: (m["peak"] - m["runtime"]) / (bp["peak"] - bp["runtime"]), None),
        ("(ES - runtime - backup) / (backprop - runtime)",
         lambda m: (m["peak"] - m["runtime"] - m["backup"]) / (bp["peak"] - bp["runtime"]), None),
    ]  # fmt: skip
    for label, fn, bound in ratios:
        vals = [fn(m) for m in es_rows]
        cells = " | ".join(f"{v:.2f}" for v in vals)
        text = f"<= {bound}" if bound else "(context)"
        verdict = ", ".join(met(v <= bound) for v in vals) if bound else "-"
        lines.append(f"| {label} | {cells} | {text} | {verdict} |")
    if not all(memory[k]["reset"] for k in memory):
        lines.append("\n> the peak counter could not be reset: peaks include model loading")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="local HF model folder")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 8 tokens, N = 8")
    parser.add_argument(
        "--noise",
        choices=("generator", "table"),
        default="generator",
        help="the space's noise mode (table: windows of a shared noise table)",
    )
    parser.add_argument("--json", help="also write the raw measurements here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        fn = child_timing if args.child == "timing" else child_memory
        print("RESULT " + json.dumps(fn(args)), flush=True)
        return
    if args.quick:
        args.prompts, args.new_tokens, args.population = 4, 8, 8
    if not (Path(args.model).expanduser() / "config.json").is_file():
        sys.exit(f"no model folder at {args.model}: run the esbox conversion or pass --model")
    print("running (each part in its own subprocess)...", file=sys.stderr, flush=True)
    timing = run_child("timing", args)
    modes = ["inference", *(f"es_{n}" for n, _ in STRATEGIES), "backprop"]
    memory = {mode: run_child(mode, args) for mode in modes}
    print(report(timing, memory, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"timing": timing, "memory": memory}, indent=1))


if __name__ == "__main__":
    main()
