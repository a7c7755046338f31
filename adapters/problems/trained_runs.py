"""Trained runs to evaluate side by side: each run directory's ``problem:`` section (ES and GRPO
runs write the same one) and trained ``model/``, and the check that the runs agree on all that
makes a comparison fair — one start model, task, agent, answer length and dtype."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esbox.errors import ConfigError
from esbox.runconfig import load_yaml, resolve_problem

from .registry import normalize_problem, problem_options

CONFIG_FILE = "config.yaml"
MODEL_DIR = "model"
CONTEXT_FILE = "best_context.txt"
# problem keys on which the compared runs must agree: the start model (the base), the questions
# and how they are asked and scored, the tool loop, the answer length and the weight dtype
SHARED_KEYS = ("model", "task", "agent", "max_new_tokens", "dtype")


@dataclass(frozen=True)
class TrainedRun:
    """A run directory: its resolved ``problem:`` section, its trained model folder and, for a
    run that co-evolved contexts, its best context (``best_context.txt``)."""

    path: Path
    problem: dict[str, Any]
    context: str | None = None

    @property
    def model(self) -> Path:
        """The trained model (a transformers folder)."""
        return self.path / MODEL_DIR


def read_run(path: Path) -> TrainedRun:
    """The run in ``path``; ConfigError when it is no finished LLM run directory."""
    config = path / CONFIG_FILE
    if not config.is_file():
        raise ConfigError(f"{path} has no {CONFIG_FILE}: is it an esbox run directory?")
    problem = normalize_problem(resolve_problem(load_yaml(config).get("problem") or {},
                                                problem_options()))  # fmt: skip
    if problem["kind"] != "llm":
        raise ConfigError(f"{path}: evaluate needs an LLM run (problem.kind: llm), "
                          f"not {problem['kind']!r}")  # fmt: skip
    if not (path / MODEL_DIR / "config.json").is_file():
        raise ConfigError(f"{path} has no trained {MODEL_DIR}/ yet (it is written when the run "
                          "stops; esbox resume finishes an interrupted run)")  # fmt: skip
    if not (path / CONTEXT_FILE).is_file():
        return TrainedRun(path, problem)
    if problem["agent"]:
        raise ConfigError(f"{path} co-evolved its skill text ({CONTEXT_FILE}): evaluating an "
                          "agent model with its context is not supported yet")  # fmt: skip
    context = (path / CONTEXT_FILE).read_text(encoding="utf-8").removesuffix("\n")
    return TrainedRun(path, problem, context)


def check_comparable(runs: list[TrainedRun], keys: tuple[str, ...] = SHARED_KEYS) -> None:
    """ConfigError naming the first ``problem.<key>`` on which a run differs from the first."""
    first = runs[0]
    for run in runs[1:]:
        for key in keys:
            found = first_difference(first.problem[key], run.problem[key], f"problem.{key}")
            if found is not None:
                where, mine, theirs = found
                raise ConfigError(
                    f"{where} differs: {first.path} {_show(mine)}, {run.path} {_show(theirs)}; "
                    "runs compared side by side must agree on it"
                )


_UNSET = object()


def first_difference(a: Any, b: Any, where: str) -> tuple[str, Any, Any] | None:
    """The dotted key (below ``where``) and values of the first place where ``a`` and ``b``
    differ, descending into mappings; None when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            found = first_difference(a.get(key, _UNSET), b.get(key, _UNSET), f"{where}.{key}")
            if found is not None:
                return found
        return None
    return None if a == b else (where, a, b)


def _show(value: Any) -> str:
    """``has [1, 2]`` or ``leaves it unset``."""
    if value is _UNSET:
        return "leaves it unset"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return "has " + (text if len(text) <= 120 else text[:117] + "...")
