"""Tasks: prompts with a verifiable reward (by task family), answer checking, metrics, rollout
evaluators and context proposers; may import ``generation``, ``models`` and the core."""

from .arithmetic import ArithmeticTask
from .base import Example, RowTask, Task
from .loading import load_task
from .math_problems import MathTask
from .metrics import evaluate
from .qa import QATask
from .rollouts import HeldoutValidation, RolloutEvaluator

__all__ = [
    "ArithmeticTask",
    "Example",
    "HeldoutValidation",
    "MathTask",
    "QATask",
    "RolloutEvaluator",
    "RowTask",
    "Task",
    "evaluate",
    "load_task",
]
