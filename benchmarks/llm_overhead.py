"""LLM overhead of ES on the shipped model: the sweep's own time against the rollouts it
brackets, and peak RSS of an ES step against plain inference and one backprop step.

1. Time: a steady-state ES step per variant (openai_es and copes K=4, each with and without
   ``reflect_antithetic``): every member's rollout (16 ArithmeticTask prompts x 32 new tokens,
   greedy, HFBackend, no stop string) inside one ``space.sweep``, the sweep's own work
   (backup, writing each member, one restore) timed apart from the rollouts, then the update.
   A first step with 2-token rollouts comes before it and is reported apart: it allocates
   the reused buffers and the noise table, once a run. Also one call of each space
   operation on the whole model. Target: at most 5% a member.
2. Memory: peak RSS of an ES step (sweep + rollouts + apply of the update), of the same rollout
   without ES, and of one forward+backward+AdamW step on the same prompts plus 32 tokens. Each
   runs in its own subprocess; the peak counter is reset after the model is loaded. Targets:
   ES <= 1.1x inference (host backup reported separately), <= 1/4 backprop.

    python benchmarks/llm_overhead.py --noise generator     # or --noise table

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
from functools import partial
from pathlib import Path
from typing import Any

MIB = float(1 << 20)
SIGMA, LEARNING_RATE = 2e-3, 2e-3
STRATEGIES = (("openai_es", {}), ("copes", {"subspaces": 4}))
DEFAULT_MODEL = "~/.cache/esbox/models/smollm2-135m-instruct"
DEFAULT_CHUNK_SIZE = 1 << 20  # esbox.adapters.torch_space.MODEL_CHUNK_SIZE (children import it)
DEFAULT_TABLE_SIZE = 1 << 25  # esbox.noise.DEFAULT_TABLE_SIZE


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
    from esbox.adapters.torch_space import TorchModuleSpace

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
    baseline, reset = settle_and_reset()
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
        before = rss_mib()
        with space.sweep(members[:2]) as sweep:  # an antithetic pair
            out["backup_measured"] = rss_mib() - before
            out["rollouts"] = [rollout() for _ in sweep]
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
        k = options.get("subspaces", 1)
        pattern = 2 * pattern_length(k, max(c.numel for c in space.chunks))
        out["labels"] = pattern * label_dtype(k).itemsize / MIB if k > 1 else 0.0
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
        "--chunk-size",
        str(args.chunk_size),
        "--table-size",
        str(args.table_size),
        "--dtype",
        args.dtype,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"child {mode} failed:\n{proc.stderr[-3000:]}")
    print(f"  {mode}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return json.loads(lines[-1][len("RESULT ") :])


def measure_memory(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every memory run ``args.repeats`` times, interleaved so drift hits all alike; each keeps
    the run with its median peak, plus every run's peak (the backprop peak varies by ~10%)."""
    modes = ["inference", *(f"es_{n}" for n, _ in STRATEGIES), "backprop"]
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(args.repeats):
        for mode in modes:
            runs[mode].append(run_child(mode, args))
    memory = {}
    for mode, results in runs.items():
        results.sort(key=lambda m: m["peak"])
        memory[mode] = {**results[len(results) // 2], "peaks": [m["peak"] for m in results]}
    return memory


def met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def report(timing: dict[str, Any], memory: dict[str, dict[str, Any]], args) -> str:
    first = next(iter(timing["variants"].values()))["rollouts"]
    lines = [
        f"Noise: {args.noise}"
        + (f" ({args.table_size:,} fp32 normals)" if args.noise == "table" else "")
        + f", chunks of {args.chunk_size} elements. Rollout: {args.prompts} "
        f"prompts x max {args.new_tokens} new tokens, greedy, no stop string; "
        f"{first[0]['forwards']} forward passes each; tokens before EOS: "
        f"{min(r['new_tokens'] for r in first):.0f}-{max(r['new_tokens'] for r in first):.0f} "
        f"a rollout. d = {timing['dimension']:,} {args.dtype} weights, {args.threads} threads, "
        f"load average at the end {timing['loadavg'][0]:.1f}.",
        "",
        "| variant | rollout a member (mean) | sweep overhead a member | fraction of the rollout "
        "| target <= 5% | first step's overhead a member | apply the update (terms) |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for label, v in timing["variants"].items():
        roll = statistics.mean(r["wall"] for r in v["rollouts"])
        cost = v["overhead"] / v["members"]
        lines.append(
            f"| {label} (N={v['members']}) | {roll:.2f} s | {cost:.3f} s | {cost / roll:.1%} "
            f"| {met(cost / roll <= 0.05)} | {v['first_overhead'] / v['members']:.3f} s "
            f"| {v['apply']:.2f} s ({v['terms']}) |"
        )
    lines += [
        "",
        "The space's operations on the whole model, one call each (wall s):",
        "",
        "| operation | " + " | ".join(timing["profile"]) + " |",
        "|---|" + "---:|" * len(timing["profile"]),
    ]
    operations = dict.fromkeys(op for p in timing["profile"].values() for op in p)
    for op in operations:
        cells = " | ".join(f"{p[op]:.3f}" if op in p else "-" for p in timing["profile"].values())
        lines.append(f"| {op} | {cells} |")
    inf, bp = memory["inference"], memory["backprop"]
    lines += [
        "",
        f"Memory: each run {args.repeats} times in a fresh subprocess, interleaved; the median "
        "peak, with the range of all runs in brackets.",
        "",
        "| run (own subprocess) | runtime RSS (no model) | RSS with model | peak RSS "
        "| peak - RSS with model | notes |",
        "|---|---:|---:|---:|---:|---|",
    ]

    def row(label: str, m: dict[str, Any], notes: str) -> str:
        spread = f" ({min(m['peaks']):.0f}-{max(m['peaks']):.0f})" if len(m["peaks"]) > 1 else ""
        return (
            f"| {label} | {m['runtime']:.0f} MiB | {m['baseline']:.0f} MiB | "
            f"{m['peak']:.0f} MiB{spread} | {m['peak'] - m['baseline']:.0f} MiB | {notes} |"
        )

    lines.append(row("plain inference", inf, "the same rollout, no ES"))
    es_rows = [memory[f"es_{name}"] for name, _ in STRATEGIES]
    for (name, _), m in zip(STRATEGIES, es_rows, strict=True):
        notes = (
            f"host backup {m['backup']:.0f} MiB (RSS rose {m['backup_measured']:.0f} MiB on "
            f"entering the sweep), label pattern {m['labels']:.2f} MiB, {m['terms']} update terms"
        )
        lines.append(row(f"ES step, {name}", m, notes))
    recipe = ", fp32 weights and AdamW, bf16 autocast" if args.dtype == "bfloat16" else ""
    backprop_notes = f"{bp['tokens']} tokens, {bp['seconds']:.1f} s{recipe}"
    lines.append(row("backprop step (AdamW)", bp, backprop_notes))
    lines += ["", "| ratio | openai_es | copes K=4 | target | met |", "|---|---:|---:|---|---|"]
    ratios = [
        ("ES peak / inference peak", lambda m: m["peak"] / inf["peak"], 1.1),
        ("(ES peak - host backup) / inference peak",
         lambda m: (m["peak"] - m["backup"]) / inf["peak"], 1.1),
        ("ES peak / backprop peak", lambda m: m["peak"] / bp["peak"], 0.25),
        ("(ES peak - host backup) / backprop peak",
         lambda m: (m["peak"] - m["backup"]) / bp["peak"], 0.25),
        ("same, worst pairing: (largest ES peak - backup) / smallest backprop peak",
         lambda m: (max(m["peaks"]) - m["backup"]) / min(bp["peaks"]), 0.25),
        ("floor: plain inference peak / backprop peak (no ES)",
         lambda m: inf["peak"] / bp["peak"], None),
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
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument(
        "--table-size", type=int, default=DEFAULT_TABLE_SIZE, help="normals in the noise table"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="weights of inference and ES (bfloat16: ES keeps an fp32 master on the host); "
        "backprop then runs the mixed-precision recipe (fp32 weights and AdamW, bf16 autocast)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each memory measurement (median kept)"
    )
    parser.add_argument("--json", help="also write the raw measurements here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        fn = child_timing if args.child == "timing" else child_memory
        print("RESULT " + json.dumps(fn(args)), flush=True)
        return
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.quick:
        args.prompts, args.new_tokens, args.population = 4, 8, 8
    if not (Path(args.model).expanduser() / "config.json").is_file():
        sys.exit(f"no model folder at {args.model}: run the esbox conversion or pass --model")
    print("running (each part in its own subprocess)...", file=sys.stderr, flush=True)
    timing = run_child("timing", args)
    memory = measure_memory(args)
    print(report(timing, memory, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"timing": timing, "memory": memory}, indent=1))


if __name__ == "__main__":
    main()
