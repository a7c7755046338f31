"""Problems: what a run config's ``problem:`` section builds, and the whole run of a config (the
top room of the ES side: may import every other room; only ``rl``, which builds GRPO runs from the
same configs, imports it)."""

from . import black_box, llm  # noqa: F401  (registers the problem kinds, in this order)
from .llm import LLMProblemOptions, LLMRun, build_llm, resolve_model_path
from .registry import (
    PROBLEM_KINDS,
    Problem,
    ProblemKind,
    build_problem,
    problem_kind,
    problem_options,
)
from .runs import Session, build_session, load_config, load_run, resolve_config

__all__ = [
    "PROBLEM_KINDS",
    "LLMProblemOptions",
    "LLMRun",
    "Problem",
    "ProblemKind",
    "Session",
    "build_llm",
    "build_problem",
    "build_session",
    "load_config",
    "load_run",
    "problem_kind",
    "problem_options",
    "resolve_config",
    "resolve_model_path",
]
