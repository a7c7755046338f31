"""An environment driven by the agent loop: one :class:`Episode` per trajectory, holding its
environment instance and the row it resets from, with the environment's methods as tools.

The loop calls ``start`` (the first observation, appended to the last user message as TRL
does), runs the episode's tools like any other, passes a reply without a tool call to ``move``
when the environment reads moves, and asks ``score`` at the end. An exception the environment
raises is caught here and ends the episode as a counted error (``error``), never the rollout.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from esbox.adapters.environments.base import environment_reward, is_text_driven, tool_methods

from .tools import FunctionTool, Tool


class MethodTool(Tool):
    """A bound environment method as a tool: name, description and parameters from its type
    hints and Google-style docstring (transformers' ``get_json_schema``, as TRL reads them)."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self.method = method
        schema = _schema(method)
        self.name = schema["name"]
        self.description = schema.get("description", "")
        self.parameters = schema.get("parameters", {"type": "object", "properties": {}})

    def __call__(self, **arguments: Any) -> str:
        return str(self.method(**arguments))


def _schema(method: Callable[..., Any]) -> dict[str, Any]:
    try:
        from transformers.utils import get_json_schema

        return dict(get_json_schema(method)["function"])
    except Exception:  # no transformers, or a docstring it cannot read: esbox's own reading
        doc = (inspect.getdoc(method) or method.__name__).strip().split("\n\n")[0]
        built = FunctionTool(method, method.__name__, " ".join(doc.split()))
        return {
            "name": built.name,
            "description": built.description,
            "parameters": built.parameters,
        }


class Episode:
    """One trajectory's environment: ``environment`` reset from ``row`` when the loop starts."""

    def __init__(self, environment: Any, row: Mapping[str, Any]) -> None:
        if not callable(getattr(environment, "reset", None)):
            raise TypeError(f"{type(environment).__name__} has no reset method: not an environment")
        self.environment, self.row = environment, dict(row)
        self.tools: dict[str, Tool] = {
            t.name: t for t in map(MethodTool, tool_methods(environment))
        }
        self.text_driven = is_text_driven(environment)
        self.error: str | None = None  # what the environment raised, when it did

    def _fail(self, where: str, exc: BaseException) -> None:
        self.error = f"{where}: {type(exc).__name__}: {exc}"

    def start(self) -> str | None:
        """``reset(**row)``'s first observation (None on an error, recorded in ``error``)."""
        try:
            observation = self.environment.reset(**self.row)
        except Exception as exc:
            self._fail("reset", exc)
            return None
        return None if observation is None else str(observation)

    def move(self, text: str) -> tuple[str, bool]:
        """The environment's answer to a reply and whether the episode is over; an error ends
        it (recorded in ``error``)."""
        try:
            observation, done = self.environment.step(text)
        except Exception as exc:
            self._fail("step", exc)
            return "", True
        return ("" if observation is None else str(observation)), bool(done)

    def score(self) -> float | None:
        """The environment's reward (None when it has none: the task scores the answer); an
        episode that failed scores 0."""
        if self.error is not None:
            return 0.0
        try:
            return environment_reward(self.environment)
        except Exception as exc:
            self._fail("reward", exc)
            return 0.0
