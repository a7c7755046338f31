"""Benchmark functions of a vector, vectorised over a batch; may import the core only."""

from .catalog import FUNCTIONS, BenchmarkFunction, get_function, make_function, rotate

__all__ = ["FUNCTIONS", "BenchmarkFunction", "get_function", "make_function", "rotate"]
