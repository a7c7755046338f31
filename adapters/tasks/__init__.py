"""Tasks: prompts with a verifiable reward (by task family), answer checking, metrics, rollout
evaluators and context proposers; may import ``generation``, ``models`` and the core."""

from .arithmetic import ArithmeticTask
from .base import Example, RowTask, Task
from .loading import load_task
from .math_problems import MathTask
from .metrics import evaluate
from .multihop import MultiHopQATask
from .qa import QATask
from .rollouts import HeldoutValidation, RolloutEvaluator
from .tool_math import ToolMathTask

__all__ = [
    "ArithmeticTask",
    "Example",
    "HeldoutValidation",
    "MathTask",
    "MultiHopQATask",
    "QATask",
    "RolloutEvaluator",
    "RowTask",
    "Task",
    "ToolMathTask",
    "evaluate",
    "load_task",
]
