"""Shared measurement and reporting helpers of the benchmark suites.

Memory probes (current and peak RSS, settle, peak reset), one measurement in a fresh
subprocess, a stopwatch, and the report's pieces: markdown tables, CSV files and the
environment line.

The child protocol: the parent runs ``python -m <module> --child '<json spec>'`` with the
repository root on ``PYTHONPATH`` and as the working directory (so the suites run from any
directory); the child module calls :func:`serve_child`, which prints ``RESULT <json>`` as its
last line. ``python -m benchmarks.measure --child '{"kind": "echo", ...}'`` is the trivial
child the tests use.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MIB = float(1 << 20)
ROOT = Path(__file__).resolve().parents[1]  # the repository root, which holds benchmarks/
RESULT_PREFIX = "RESULT "
STDERR_TAIL = 4000


# -- memory probes (Linux /proc; ru_maxrss elsewhere) -----------------------------------------
def _status_kib(key: str) -> int | None:
    with contextlib.suppress(OSError), open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def rss_mib() -> float:
    """Current resident set size (MiB)."""
    kib = _status_kib("VmRSS")
    return kib / 1024 if kib is not None else peak_mib()


def peak_mib() -> float:
    """Peak RSS (MiB) since the last :func:`reset_peak` (VmHWM), else since start (ru_maxrss)."""
    kib = _status_kib("VmHWM")
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


def stopwatch() -> Callable[[], float]:
    """Seconds since this call, as a function: ``elapsed = stopwatch(); ...; elapsed()``."""
    start = time.perf_counter()
    return lambda: time.perf_counter() - start


# -- one measurement in a fresh subprocess ------------------------------------------------------
def run_child(
    module: str,
    spec: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``python -m module --child '<json spec>'`` in a fresh interpreter; its result.

    ``env`` adds variables (e.g. ``MALLOC_MMAP_THRESHOLD_``) to the inherited environment.
    Raises ``RuntimeError`` with the tail of the child's stderr when it fails, times out or
    prints no ``RESULT`` line.
    """
    text = json.dumps(dict(spec))
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    command = [sys.executable, "-m", module, "--child", text]
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=child_env,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as error:
        stderr = error.stderr.decode() if isinstance(error.stderr, bytes) else error.stderr or ""
        raise RuntimeError(
            f"benchmark child {module} {text} timed out after {timeout} s:\n{stderr[-STDERR_TAIL:]}"
        ) from None
    lines = [x for x in proc.stdout.splitlines() if x.startswith(RESULT_PREFIX)]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"benchmark child {module} {text} failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-STDERR_TAIL:]}"
        )
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def equal_budget(key: str, seconds: float) -> dict[str, Any]:
    """Config overrides that stop a run at ``seconds`` of the clock ``key`` names (e.g.
    ``budget.max_cpu_seconds``) and at nothing else, one torch thread, no validation or
    periodic checkpoints inside the budget: the runs of a comparison get the same compute."""
    values: dict[str, Any] = {
        "budget.max_steps": None,
        "budget.max_seconds": None,
        "budget.max_evaluations": None,
        "problem.validation_every": 0,
        "problem.threads": 1,
        "checkpoint.every": 0,
    }
    values[key] = seconds  # last: budget.max_seconds may be the clock itself
    return values


BUDGET_KEYS = {"cpu": "budget.max_cpu_seconds", "wall": "budget.max_seconds"}  # --clock


def add_clock_option(parser: argparse.ArgumentParser) -> None:
    """``--clock cpu|wall``: the clock of a suite's equal budget (wall seconds on one GPU)."""
    parser.add_argument(
        "--clock",
        choices=tuple(BUDGET_KEYS),
        default="cpu",
        help="the equal budget: CPU seconds (a CPU), or wall seconds (one GPU)",
    )


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items of a suite's repeatable ``--set`` options, each value as YAML."""
    import yaml

    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set takes KEY=VALUE, got {item!r}")
        values[key] = yaml.safe_load(value)
    return values


def set_flags(values: Mapping[str, Any]) -> list[str]:
    """``--set key=value`` flags of the esbox CLI, each value as inline YAML."""
    import yaml

    flags = []
    for key, value in values.items():
        text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
        flags += ["--set", f"{key}={text}"]
    return flags


def run_esbox(arguments: Sequence[str], *, timeout: float | None = None) -> None:
    """``esbox <arguments>`` (e.g. an ``optimize`` run) in its own process from the repository
    root; RuntimeError with the tail of its stderr when it fails."""
    command = [sys.executable, "-m", "esbox.cli.main", *arguments]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
    )
    if proc.returncode:
        raise RuntimeError(
            f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-STDERR_TAIL:]}"
        )


def serve_child(
    handler: Callable[[dict[str, Any]], Mapping[str, Any]], argv: Sequence[str] | None = None
) -> int:
    """The child's side: parse ``--child '<json spec>'``, run ``handler(spec)``, print
    ``RESULT <json>``."""
    parser = argparse.ArgumentParser(description="run one benchmark measurement")
    parser.add_argument("--child", required=True, help="the measurement, as a JSON object")
    spec = json.loads(parser.parse_args(argv).child)
    print(RESULT_PREFIX + json.dumps(dict(handler(spec))), flush=True)
    return 0


def _echo(spec: dict[str, Any]) -> dict[str, Any]:
    """The trivial child: its spec back, one variable of its environment, and its RSS."""
    name = spec.get("env_var")
    return {
        "spec": spec,
        "env": os.environ.get(name) if name else None,
        "cwd": os.getcwd(),
        "rss_mib": rss_mib(),
    }


# -- reporting ------------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A markdown table; ``align`` holds one letter a column, ``l`` (``---``) or ``r``
    (``---:``), default all ``l``."""
    align = align or "l" * len(headers)
    if len(align) != len(headers):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(headers)} columns")
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align)
    lines = ["| " + " | ".join(headers) + " |", rule]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: str | Path, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> Path:
    """Write one table as CSV (a header line, then the rows); creates the folder; the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(headers)
        writer.writerows(rows)
    return path


def write_tables(
    folder: str | Path | None, tables: Mapping[str, tuple[Sequence[str], Sequence[Sequence[Any]]]]
) -> list[Path]:
    """Each ``name: (headers, rows)`` as ``folder/name.csv`` (nothing when folder is None)."""
    if folder is None:
        return []
    return [write_csv(Path(folder) / f"{name}.csv", h, r) for name, (h, r) in tables.items()]


DEFAULT_OUT = "benchmark-results"  # under the working directory; ignored by git


def add_output_option(parser: argparse.ArgumentParser) -> None:
    """``--out DIR`` (alias ``--csv``, which ``all`` passes): where CSV and PNG files go."""
    parser.add_argument(
        "--out",
        "--csv",
        dest="csv",
        metavar="DIR",
        default=DEFAULT_OUT,
        help=f"write the CSV tables and PNG figures into DIR (default ./{DEFAULT_OUT})",
    )


def add_method_options(
    parser: argparse.ArgumentParser, peers: Sequence[str], known: Sequence[str] = ()
) -> None:
    """``--strategies`` (esbox's, default every registered one) and ``--peers`` (default
    ``peers``; ``known`` lists the others a suite can run)."""
    parser.add_argument(
        "--strategies",
        default=None,
        help="esbox strategies, comma-separated (default: every registered one)",
    )
    also = f"; known: {', '.join(known)}" if known else ""
    parser.add_argument(
        "--peers",
        default=",".join(peers),
        help=f"peers, comma-separated ('' for none; default {','.join(peers)}{also})",
    )


def add_jobs_option(parser: argparse.ArgumentParser) -> None:
    """``--jobs N``: worker processes for suites that run many independent runs."""
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes, one thread each (default 2)",
    )


def esbox_strategies(text: str | None) -> list[str]:
    """The esbox strategies named in a comma-separated ``--strategies`` value (default: every
    registered one); an unknown name raises ``ValueError`` listing the known ones."""
    from esbox import available_strategies

    known = list(available_strategies())
    names = [n.strip() for n in (text or "").split(",") if n.strip()] or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; registered: {', '.join(known)}")
    return names


def versions(modules: Sequence[str]) -> str:
    """``name version`` of each importable distribution in ``modules``, comma-separated."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in modules:
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{name} {version(name)}")
    return ", ".join(found)


def environment(threads: int | None = None) -> str:
    """One line: python, torch and numpy versions, CPUs, platform, load average."""
    import numpy as np
    import torch

    per_measurement = (
        f" ({threads} intra-op thread(s) per measurement)" if threads is not None else ""
    )
    return (
        f"python {platform.python_version()}, torch {torch.__version__}{per_measurement}, "
        f"numpy {np.__version__}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.machine()}, load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    raise SystemExit(serve_child(_echo))
