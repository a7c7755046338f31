"""Core benchmarks: peak memory is independent of the population; time per generation.

Three tables, each row measured in its own subprocess so that memory peaks never mix:

1. peak RSS of ``esbox.optimize(rastrigin, x0, strategy="copes")`` for N = 16 and N = 256 at
   d = 10^7 (target: N = 256 at most 1.2x N = 16);
2. time per generation at d = 10^6, N = 256, split into ask / perturb / evaluate / restore /
   tell / apply, for copes and openai_es, next to a naive explicit-noise implementation;
3. peak memory of seed replay against the naive implementation, which materialises the
   N x d noise matrix (at d = 10^6, where that matrix still fits).

Run ``python benchmarks/run_core.py`` (all core benchmarks) or this file directly;
``--quick`` shrinks the sizes for a smoke run. Tables are printed as markdown. Seed replay
is why the peak does not grow: no noise is stored, every member's noise is regenerated chunk
by chunk from its seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

SIGMA = 0.01
LEARNING_RATE = 0.01
SUBSPACES = 4
EVAL_BLOCK = 1 << 20
PHASES = ("ask", "perturb", "evaluate", "restore", "tell", "apply")
MIB = float(1 << 20)


# -- memory probes (Linux /proc; ru_maxrss elsewhere) -----------------------------------------
def _proc_status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mib() -> float:
    """Current resident set size."""
    kib = _proc_status_kib("VmRSS")
    return kib / 1024 if kib is not None else peak_mib()


def peak_mib() -> float:
    """Peak resident set size since the last ``reset_peak`` (or process start)."""
    kib = _proc_status_kib("VmHWM")
    if kib is not None:
        return kib / 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / MIB if sys.platform == "darwin" else maxrss / 1024


def settle() -> float:
    """Free what start-up left behind (garbage, glibc free lists); returns the current RSS."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mib()


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


# -- the objective ------------------------------------------------------------------------------
def make_rastrigin(kind: str) -> Callable[[np.ndarray], float]:
    """Rastrigin (to minimize): the library's numpy kernel, or the same sum in 2^20 blocks.

    The blocked form gives the same value (checked against the library at start-up) with
    bounded temporaries and ~20x less time at d = 10^7, so the benchmark measures esbox and
    not the objective's scratch arrays.
    """
    from esbox.adapters.functions import get_function

    reference = get_function("rastrigin")
    if kind == "numpy":
        return reference

    import torch

    def rastrigin(x: np.ndarray) -> float:
        t = torch.from_numpy(np.ascontiguousarray(x))
        total = 10.0 * t.numel()
        for lo in range(0, t.numel(), EVAL_BLOCK):
            z = t[lo : lo + EVAL_BLOCK].to(torch.float64)
            total += float(z.square().sum()) - 10.0 * float(torch.cos(z * (2 * math.pi)).sum())
        return total

    probe = np.random.default_rng(1).uniform(-5.12, 5.12, 3 * EVAL_BLOCK // 2 + 7)
    expected, got = reference(probe), rastrigin(probe)
    if abs(got - expected) > 1e-9 * abs(expected):
        raise AssertionError(f"blocked rastrigin {got} differs from the library's {expected}")
    return rastrigin


def start_point(d: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-5.12, 5.12, d)


def strategy_options(strategy: str, population: int) -> dict[str, Any]:
    options: dict[str, Any] = {
        "population": population,
        "sigma": SIGMA,
        "learning_rate": LEARNING_RATE,
    }
    if strategy == "copes":
        options["subspaces"] = SUBSPACES
    return options


# -- child measurements (one per subprocess) ------------------------------------------------------
def child_optimize(d: int, population: int, steps: int, function: str) -> dict[str, Any]:
    """Peak RSS of ``esbox.optimize`` with copes; peak recorded after every step."""
    import esbox

    f = make_rastrigin(function)
    x0 = start_point(d)
    baseline = settle()
    reset = reset_peak()
    per_step: list[float] = []

    def record_peak(runner: Any, metrics: dict[str, Any]) -> None:
        per_step.append(peak_mib())

    start = time.perf_counter()
    result = esbox.optimize(
        f,
        x0,
        strategy="copes",
        max_steps=steps,
        seed=0,
        callbacks=[record_peak],
        **strategy_options("copes", population),
    )
    seconds = time.perf_counter() - start
    return {
        "baseline": baseline,
        "peak": peak_mib(),
        "per_step_peak": per_step,
        "peak_reset": reset,
        "seconds_per_step": seconds / max(result.steps, 1),
        "steps": result.steps,
    }


def child_loop(d: int, population: int, steps: int, strategy: str, function: str) -> dict[str, Any]:
    """An ask/tell loop by hand, timing each phase; also reports the peak RSS."""
    import esbox

    f = make_rastrigin(function)
    x0 = start_point(d)
    baseline = settle()
    reset = reset_peak()
    clock = time.perf_counter
    totals = dict.fromkeys(PHASES, 0.0)
    space = esbox.VectorSpace(x0)
    es = esbox.make_strategy(strategy, space, seed=0, **strategy_options(strategy, population))
    for _ in range(steps):
        t0 = clock()
        perturbations = es.ask()
        totals["ask"] += clock() - t0
        rewards = []
        for p in perturbations:
            t0 = clock()
            context = space.perturbed(p)
            context.__enter__()
            t1 = clock()
            try:
                rewards.append(-f(space.vector))
            finally:
                t2 = clock()
                context.__exit__(None, None, None)
                t3 = clock()
            totals["perturb"] += t1 - t0
            totals["evaluate"] += t2 - t1
            totals["restore"] += t3 - t2
        t0 = clock()
        update = es.tell(rewards)
        t1 = clock()
        space.apply(update)
        totals["tell"] += t1 - t0
        totals["apply"] += clock() - t1
    return {
        "baseline": baseline,
        "peak": peak_mib(),
        "peak_reset": reset,
        "phases": {k: v / steps for k, v in totals.items()},
    }


def child_naive(d: int, population: int, steps: int, function: str) -> dict[str, Any]:
    """OpenAI-ES with an explicit N x d float32 noise matrix (what seed replay avoids)."""
    f = make_rastrigin(function)
    x0 = start_point(d)
    baseline = settle()
    reset = reset_peak()
    clock = time.perf_counter
    totals = dict.fromkeys(PHASES, 0.0)
    rng = np.random.default_rng(0)
    theta = x0.copy()
    for _ in range(steps):
        t0 = clock()
        eps = rng.standard_normal((population, d), dtype=np.float32)
        totals["ask"] += clock() - t0
        rewards = np.empty(population)
        for i in range(population):
            t0 = clock()
            x = theta + SIGMA * eps[i]
            t1 = clock()
            rewards[i] = -f(x)
            totals["perturb"] += t1 - t0
            totals["evaluate"] += clock() - t1
            del x
        t0 = clock()
        std = rewards.std()
        shaped = (rewards - rewards.mean()) / std if std > 0 else np.zeros(population)
        t1 = clock()
        gradient = shaped.astype(np.float32) @ eps / (population * SIGMA)
        theta += LEARNING_RATE * gradient
        totals["tell"] += t1 - t0
        totals["apply"] += clock() - t1
        del eps, gradient
    return {
        "baseline": baseline,
        "peak": peak_mib(),
        "peak_reset": reset,
        "phases": {k: v / steps for k, v in totals.items()},
    }


CHILDREN = {"optimize": child_optimize, "loop": child_loop, "naive": child_naive}


THREADS = 1
MMAP_THRESHOLD: int | None = None


def run_child(kind: str, timeout: float = 1800, **kwargs: Any) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter and return its JSON result."""
    spec = json.dumps({"kind": kind, "threads": THREADS, **kwargs})
    env = dict(os.environ)
    if MMAP_THRESHOLD is not None:  # glibc: serve blocks above this by mmap, unmap on free
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", spec],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child {spec} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- reporting ------------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}"


def _power(d: int) -> str:
    exponent = math.log10(d)
    return f"10^{exponent:.0f}" if exponent.is_integer() else f"{d:,}"


def environment() -> str:
    import torch

    return (
        f"python {platform.python_version()}, torch {torch.__version__} "
        f"({THREADS} intra-op thread(s) per measurement), numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )


def memory_section(d: int, populations: Sequence[int], steps: int, function: str) -> str:
    results = {
        n: run_child("optimize", d=d, population=n, steps=steps, function=function)
        for n in populations
    }
    x_mib = d * 8 / MIB
    first = results[populations[0]]
    ref_extra = first["peak"] - first["baseline"]
    rows = []
    for n, r in results.items():
        extra = r["peak"] - r["baseline"]
        per_step = " / ".join(f"{p - r['baseline']:,.0f}" for p in r["per_step_peak"])
        rows.append(
            [
                n,
                r["steps"],
                f"{r['baseline']:,.0f}",
                f"{extra:,.0f}",
                per_step,
                f"{extra / x_mib:.2f}",
                f"{extra / ref_extra:.2f}x",
                f"{r['seconds_per_step']:.1f}",
            ]
        )
    last = results[populations[-1]]
    ratio = (last["peak"] - last["baseline"]) / ref_extra
    verdict = "meets" if ratio <= 1.2 else "MISSES"
    reset = all(r["peak_reset"] for r in results.values())
    note = "" if reset else " (peak counter could not be reset: peaks include start-up)"
    return "\n".join(
        [
            f"### Peak memory at d = {_power(d)} (`esbox.optimize`, copes, K = {SUBSPACES})",
            "",
            table(
                [
                    "N",
                    "steps",
                    "baseline RSS (MiB)",
                    "peak extra (MiB)",
                    "peak extra after each step (MiB)",
                    "peak extra / size of x",
                    f"vs N = {populations[0]}",
                    "s / step",
                ],
                rows,
            ),
            "",
            f"N = {populations[-1]} uses {ratio:.2f}x the peak extra memory of "
            f"N = {populations[0]}: {verdict} the target of at most 1.2x{note}. "
            f"Size of x = d x 8 bytes = {x_mib:,.0f} MiB.",
        ]
    )


def timing_section(d: int, population: int, steps: int, function: str) -> tuple[str, dict]:
    runs = {
        "copes": run_child(
            "loop", d=d, population=population, steps=steps, strategy="copes", function=function
        ),
        "openai_es": run_child(
            "loop",
            d=d,
            population=population,
            steps=steps,
            strategy="openai_es",
            function=function,
        ),
        "naive (N x d noise)": run_child(
            "naive", d=d, population=population, steps=steps, function=function
        ),
    }
    base = sum(runs["openai_es"]["phases"].values())
    rows = []
    for name, r in runs.items():
        total = sum(r["phases"].values())
        rows.append(
            [name, *(_ms(r["phases"][k]) for k in PHASES), _ms(total), f"{total / base:.2f}x"]
        )
    text = "\n".join(
        [
            f"### Time per generation at d = {_power(d)}, N = {population} "
            f"(ms, mean of {steps} generations)",
            "",
            table(["strategy", *PHASES, "total", "vs openai_es"], rows),
            "",
            "perturb/restore are summed over the N members; evaluate is the objective itself. "
            "The naive row samples the noise matrix in ask, builds theta + sigma eps_i in "
            "perturb (nothing to restore) and multiplies the matrix in apply.",
        ]
    )
    return text, runs


def replay_vs_naive_section(
    d: int, populations: Sequence[int], function: str, measured: dict[str, Any]
) -> str:
    rows = []
    for n in populations:
        if n == populations[-1]:
            esbox_run, naive_run = measured["copes"], measured["naive (N x d noise)"]
        else:
            esbox_run = run_child(
                "loop", d=d, population=n, steps=1, strategy="copes", function=function
            )
            naive_run = run_child("naive", d=d, population=n, steps=1, function=function)
        esbox_extra = esbox_run["peak"] - esbox_run["baseline"]
        naive_extra = naive_run["peak"] - naive_run["baseline"]
        matrix = n * d * 4 / MIB
        rows.append(
            [
                n,
                f"{matrix:,.0f}",
                f"{esbox_extra:,.0f}",
                f"{naive_extra:,.0f}",
                f"{naive_extra / esbox_extra:.1f}x",
            ]
        )
    return "\n".join(
        [
            f"### Seed replay vs an explicit noise matrix at d = {_power(d)} (peak extra MiB)",
            "",
            table(
                ["N", "N x d float32 matrix", "esbox copes", "naive", "naive / esbox"],
                rows,
            ),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument(
        "--steps", type=int, default=1, help="steps of each d = 10^7 memory run (default 1)"
    )
    parser.add_argument(
        "--timing-steps", type=int, default=2, help="generations averaged in the timing table"
    )
    parser.add_argument(
        "--function",
        choices=("blocked", "numpy"),
        default="blocked",
        help="rastrigin evaluated in 2^20 blocks (default) or the library's numpy kernel",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per measurement (default 1: stable on a shared machine)",
    )
    parser.add_argument(
        "--sections",
        default="memory,timing",
        help="comma-separated: memory (d = 10^7 runs), timing (timing and naive tables)",
    )
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=None,
        metavar="BYTES",
        help="set glibc's MALLOC_MMAP_THRESHOLD_ in the measurements, so freed blocks leave "
        "RSS at once and peaks show live memory (default: glibc's dynamic threshold)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global THREADS, MMAP_THRESHOLD
    THREADS, MMAP_THRESHOLD = args.threads, args.mmap_threshold
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if not sections or sections - {"memory", "timing"}:
        parser.error(f"--sections takes memory and/or timing, got {args.sections!r}")

    if args.child:
        import torch

        spec = json.loads(args.child)
        torch.set_num_threads(spec.pop("threads"))
        result = CHILDREN[spec.pop("kind")](**spec)
        print(json.dumps(result))
        return 0

    d_memory, d_timing = (10**6, 10**5) if args.quick else (10**7, 10**6)
    populations = (16, 256)
    started = time.perf_counter()
    print("## Core benchmarks: memory and time of seed replay\n")
    print(f"Environment: {environment()}.")
    allocator = (
        f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}"
        if MMAP_THRESHOLD is not None
        else "glibc default (dynamic mmap threshold)"
    )
    print(
        f"sigma = {SIGMA}, learning rate = {LEARNING_RATE}, objective: rastrigin "
        f"({args.function}), allocator: {allocator}. Every row runs in its own subprocess.\n"
    )
    if "memory" in sections:
        print(memory_section(d_memory, populations, args.steps, args.function), "\n", flush=True)
    if "timing" in sections:
        timing, runs = timing_section(d_timing, populations[-1], args.timing_steps, args.function)
        print(timing, "\n", flush=True)
        print(replay_vs_naive_section(d_timing, populations, args.function, runs), "\n")
    print(
        f"Total wall time: {time.perf_counter() - started:.0f} s "
        f"(load average at the end {os.getloadavg()[0]:.1f})."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
