"""Problem kinds over a vector: ``function`` (a built-in benchmark function) and ``callable``
(any Python function named as ``module:function`` or ``file.py:function``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from esbox.adapters.functions import FUNCTIONS, get_function
from esbox.config import option
from esbox.errors import ConfigError
from esbox.evaluation import FunctionEvaluator
from esbox.space import VectorSpace

from .registry import Problem, problem_kind

DTYPES = ("float32", "float64")


# -- vectors ------------------------------------------------------------------------------------
def _vector(value: Any, dimension: int | None, key: str) -> np.ndarray:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if dimension is None:
            raise ConfigError(f"problem.{key} is a number, so problem.dimension must be set")
        return np.full(dimension, float(value))
    try:
        vector = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"problem.{key} must be a number or a list of numbers") from None
    if vector.ndim != 1 or vector.size == 0:
        raise ConfigError(f"problem.{key} must be a flat, non-empty list of numbers")
    if dimension is not None and vector.size != dimension:
        raise ConfigError(
            f"problem.{key} has {vector.size} values but problem.dimension is {dimension}"
        )
    if not np.isfinite(vector).all():
        raise ConfigError(f"problem.{key} must be finite")
    return vector


def _vector_save(space: VectorSpace, evaluator: FunctionEvaluator) -> Callable[[Path], dict]:
    def save(directory: Path) -> dict[str, Any]:
        np.save(directory / "final.npy", space.vector.copy())
        files = ["final.npy"]
        if evaluator.best_x is not None:
            np.save(directory / "best.npy", evaluator.best_x)
            files.insert(0, "best.npy")
        return {"best_value": evaluator.best_value, "files": files}

    return save


# -- kind: function -----------------------------------------------------------------------------
@dataclass
class FunctionProblem:
    """A built-in benchmark function of esbox.adapters.functions, minimized."""

    name: str = option(
        "rastrigin", "benchmark function (docs/functions.md)", choices=tuple(FUNCTIONS)
    )
    dimension: int = option(100, "number of parameters d", minimum=1)
    shift: int | list | None = option(None, "move the optimum: a seed, or a vector of length d")
    params: dict = option({}, "function parameters, e.g. {condition: 1.0e4} for ellipsoid")
    x0: float | list | None = option(
        None, "start: null draws it uniformly in the domain from the run seed; a number; a vector"
    )
    dtype: str = option("float64", "parameter dtype", choices=DTYPES)
    batch_size: int = option(64, "members evaluated per vectorised call", minimum=1)

    def vector_dimension(self) -> int:
        """d: the run gets the black-box strategy defaults for it."""
        return self.dimension


@problem_kind("function", FunctionProblem, "a built-in benchmark function, minimized")
def _function(options: FunctionProblem, seed: int) -> Problem:
    d = options.dimension
    fn = get_function(options.name, shift=options.shift, **options.params)
    fn.optimum(d)  # checks the dimension and the shift's length
    x0 = fn.default_x0(d, seed=seed) if options.x0 is None else _vector(options.x0, d, "x0")
    space = VectorSpace(x0, dtype=options.dtype)
    evaluator = FunctionEvaluator(fn, minimize=True, batched=True, batch_size=options.batch_size)
    save = _vector_save(space, evaluator)

    def save_with_optimum(directory: Path) -> dict[str, Any]:
        return {**save(directory), "optimum_value": fn.optimum_value(d)}

    def restart_start(restart_seed: int) -> np.ndarray:  # uniform in the domain, as x0 is
        return fn.default_x0(d, seed=restart_seed)

    label = f"{options.name}(d={d})"
    return Problem(space, evaluator, label, save_with_optimum, restart_start=restart_start)


# -- kind: callable -----------------------------------------------------------------------------
@dataclass
class CallableProblem:
    """Any Python function of a vector, named as ``module:function`` or ``file.py:function``."""

    target: str = option("", "the function: module:function or path/to/file.py:function")
    x0: float | list = option(0.0, "start point: a vector, or a number repeated dimension times")
    dimension: int | None = option(None, "d, needed when x0 is a number", minimum=1)
    minimize: bool = option(True, "minimize (true) or maximize (false) the returned value")
    batched: bool = option(False, "the function takes a (B, d) batch and returns B values")
    batch_size: int = option(64, "members per call when batched", minimum=1)
    dtype: str = option("float64", "parameter dtype", choices=DTYPES)

    def vector_dimension(self) -> int | None:
        """d (the length of x0, or ``dimension``): the run gets the black-box defaults for it."""
        if isinstance(self.x0, list):
            return len(self.x0)
        return self.dimension


def _split_target(target: str) -> tuple[str, str]:
    module, sep, attr = target.rpartition(":")
    if not sep or not module or not attr:
        raise ConfigError(
            f"problem.target must look like 'module:function' or 'path/file.py:function', "
            f"got {target!r}"
        )
    return module, attr


def _normalize_callable(problem: dict[str, Any]) -> dict[str, Any]:
    module, attr = _split_target(problem["target"])
    if module.endswith(".py"):
        problem["target"] = f"{Path(module).resolve()}:{attr}"
    return problem


def load_target(target: str) -> Callable[..., Any]:
    """The callable named by ``module:function`` or ``path/file.py:function``."""
    module_name, attr = _split_target(target)
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        if not path.is_file():
            raise ConfigError(f"problem.target: file {module_name} does not exist")
        spec = importlib.util.spec_from_file_location(f"esbox_target_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"problem.target: cannot import module '{exc.name}'") from None
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"problem.target: '{module_name}' has no attribute '{attr}'")
    if not callable(fn):
        raise ConfigError(f"problem.target: '{target}' is not callable")
    return fn


@problem_kind(
    "callable",
    CallableProblem,
    "a Python function of a vector (module:function)",
    normalize=_normalize_callable,
)
def _callable(options: CallableProblem, seed: int) -> Problem:
    if not options.target:
        raise ConfigError("problem.target is required for problem.kind 'callable'")
    fn = load_target(options.target)
    x0 = _vector(options.x0, options.dimension, "x0")
    space = VectorSpace(x0, dtype=options.dtype)
    evaluator = FunctionEvaluator(
        fn, minimize=options.minimize, batched=options.batched, batch_size=options.batch_size
    )
    label = f"{options.target.rpartition('/')[2]}(d={x0.size})"
    return Problem(space, evaluator, label, _vector_save(space, evaluator))
