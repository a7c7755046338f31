"""``python -m benchmarks <suite> [--quick] [suite options...]``, or ``all`` for every suite.

A suite is a module with ``main(argv) -> int`` whose docstring's first line says what it
measures; adding one is that file plus one line in ``SUITES``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

SUITES: dict[str, str] = {
    "core": "benchmarks.core",
    "llm": "benchmarks.llm",
    "agent-memory": "benchmarks.agent_memory",
    "overhead": "benchmarks.overhead",
    "quality": "benchmarks.quality",
    "copes": "benchmarks.copes",
    "scale": "benchmarks.scale",
    "lowrank": "benchmarks.lowrank",
    "generation": "benchmarks.generation",
    "coco": "benchmarks.coco",
    "rl": "benchmarks.rl",
    "horizon": "benchmarks.horizon",
    "ahd": "benchmarks.ahd",
}


def load(name: str) -> ModuleType:
    return importlib.import_module(SUITES[name])


def usage() -> str:
    width = max(len(name) for name in [*SUITES, "all"])
    lines = [
        "usage: python -m benchmarks <suite> [--quick] [suite options...]",
        "       python -m benchmarks all [--quick] [--csv DIR]",
        "       python -m benchmarks <suite> --help   (the suite's options)",
        "",
        "suites:",
    ]
    for name in SUITES:
        summary = (load(name).__doc__ or "").strip().splitlines()[0]
        lines.append(f"  {name:<{width}}  {summary}")
    lines.append(f"  {'all':<{width}}  every suite above, one after the other")
    return "\n".join(lines)


def run_all(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks all", description="run every suite, one after the other"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--csv", metavar="DIR", help="also write each suite's tables as CSV")
    args = parser.parse_args(argv)
    options = [*(["--quick"] if args.quick else []), *(["--csv", args.csv] if args.csv else [])]
    failed = []
    for name in SUITES:
        try:
            code = load(name).main(options)
        except SystemExit as stop:  # a suite's own exit, e.g. a missing model
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except Exception as error:  # report it, run the next suite
            print(f"suite {name} failed: {error!r}", file=sys.stderr)
            code = 1
        if code:
            failed.append(name)
        print(flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name == "all":
        return run_all(rest)
    if name not in SUITES:
        print(f"unknown suite {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return int(load(name).main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
