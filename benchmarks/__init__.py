"""esbox's benchmark suites, run as ``python -m benchmarks <suite> [--quick]``."""
