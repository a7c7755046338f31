"""Run every benchmark and print its markdown tables: ``python benchmarks/run_all.py [--quick]``.

Each entry script below runs in its own interpreter; it accepts ``--quick`` (small sizes, a
smoke run) and prints markdown.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENTRY_SCRIPTS = ["run_core.py", "llm_overhead.py"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    args = parser.parse_args()
    failed = []
    for name in ENTRY_SCRIPTS:
        command = [sys.executable, str(HERE / name), *(["--quick"] if args.quick else [])]
        if subprocess.run(command, check=False).returncode != 0:
            failed.append(name)
        print(flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
