"""esbox: Evolution Strategies for black-box optimization and forward-pass-only LLM training."""

from esbox.api import Result, optimize
from esbox.errors import ConfigError, ResumeError, RewardError, RewardTypeError
from esbox.evaluation import Evaluator, FunctionEvaluator
from esbox.registry import available_strategies, get_strategy, make_strategy, register
from esbox.runner import Budget, Runner
from esbox.schedules import Constant, Cosine, Linear, make_schedule
from esbox.space import ParameterSpace, VectorSpace
from esbox.specs import OptimizerSpec, Perturbation, Term, Update
from esbox.strategy import Strategy, StrategyOptions

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "ConfigError",
    "Constant",
    "Cosine",
    "Evaluator",
    "FunctionEvaluator",
    "Linear",
    "OptimizerSpec",
    "ParameterSpace",
    "Perturbation",
    "Result",
    "ResumeError",
    "RewardError",
    "RewardTypeError",
    "Runner",
    "Strategy",
    "StrategyOptions",
    "Term",
    "Update",
    "VectorSpace",
    "available_strategies",
    "get_strategy",
    "make_schedule",
    "make_strategy",
    "optimize",
    "register",
]
