"""Entry point for the core benchmarks: ``python benchmarks/run_core.py [--quick]``.

Runs every core benchmark in turn and prints its markdown tables. Options are passed through
(see ``python benchmarks/core_memory.py --help``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core_memory

CORE_BENCHMARKS = [core_memory.main]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return max(benchmark(args) for benchmark in CORE_BENCHMARKS)


if __name__ == "__main__":
    raise SystemExit(main())
