"""Tools an agent can call: the ``Tool`` base, the ``@tool`` decorator and the built-in tools.

A tool turns an arguments object into the text the model reads. Arguments are validated against
``parameters`` by the protocol before a tool is called, so a tool only does its job.
"""

from __future__ import annotations

import abc
import inspect
import typing
from collections.abc import Callable, Sequence
from os import PathLike
from typing import Any

if typing.TYPE_CHECKING:
    from esbox.adapters.agents.retrieval import Corpus, Passage
    from esbox.adapters.agents.sandbox import Sandbox


class ToolError(Exception):
    """A failure the model should read (bad input, nothing found), not a bug in the tool."""


class Tool(abc.ABC):
    """A named function the model can call; subclasses set the three attributes and ``__call__``."""

    name: str
    description: str
    parameters: dict[str, Any]

    @abc.abstractmethod
    def __call__(self, **arguments: Any) -> str:
        """The text the model reads for these (already validated) arguments."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hugging Face function-tool schema, as chat templates take it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}


class FunctionTool(Tool):
    """A tool made from a typed Python function by ``@tool``."""

    def __init__(self, function: Callable[..., Any], name: str, description: str) -> None:
        self.function = function
        self.name = name
        self.description = description
        self.parameters = _parameters_of(function)

    def __call__(self, **arguments: Any) -> str:
        return str(self.function(**arguments))


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Make a ``Tool`` from a function: name from ``__name__``, description from the docstring's
    first line, the schema from the type hints (parameters without a default are required)."""

    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        doc = inspect.getdoc(fn) or ""
        text = description if description is not None else doc.strip().split("\n\n")[0]
        if not text:
            raise ValueError(f"tool {fn.__name__!r} needs a docstring or a description")
        return FunctionTool(fn, name or fn.__name__, " ".join(text.split()))

    return wrap if function is None else wrap(function)


def _parameters_of(function: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a function's keyword arguments, from its type hints."""
    hints = typing.get_type_hints(function)
    properties: dict[str, Any] = {}
    required = []
    for param in inspect.signature(function).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ValueError(f"tool argument {param.name!r} must be a plain named parameter")
        hint = hints.get(param.name)
        origin = typing.get_origin(hint) or hint
        if origin not in _JSON_TYPES:
            raise ValueError(
                f"tool argument {param.name!r}: type {hint!r} has no JSON type "
                f"(use one of {', '.join(t.__name__ for t in _JSON_TYPES)})"
            )
        properties[param.name] = {"type": _JSON_TYPES[origin]}
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required}


def _string_argument(name: str, description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description}},
        "required": [name],
    }


class Calculator(Tool):
    """Exact arithmetic for the model (see ``calculator.evaluate`` for what is allowed)."""

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses, "
        "and sqrt, abs, round, min, max, floor, ceil, exp, log, log10, pi, e."
    )
    parameters = _string_argument("expression", "the expression, e.g. (37 * 412) / 4")

    def __call__(self, expression: str) -> str:
        from esbox.adapters.agents.calculator import calculate

        return calculate(expression)


class Search(Tool):
    """BM25 search over a local corpus: the top ``k`` passages with their ids."""

    name = "search"
    description = "Search the document collection; returns the best-matching passages."
    parameters = _string_argument("query", "keywords to look up")

    def __init__(
        self,
        corpus: Corpus | Sequence[Passage] | str | PathLike[str],
        k: int = 3,
        max_chars: int = 600,
    ) -> None:
        from esbox.adapters.agents.retrieval import BM25Index, Corpus

        if k < 1 or max_chars < 1:
            raise ValueError(f"k and max_chars must be positive, got k={k}, max_chars={max_chars}")
        if isinstance(corpus, (str, PathLike)):
            corpus = Corpus.from_jsonl(corpus)
        self.index = BM25Index(corpus)
        self.k = k
        self.max_chars = max_chars

    def __call__(self, query: str) -> str:
        hits = self.index.search(query, k=self.k)
        if not hits:
            raise ToolError(f"no passage matches {query!r}; try other keywords")
        return "\n\n".join(
            f"[{hit.passage.id}] {hit.passage.title}\n{_clip(hit.passage.text, self.max_chars)}"
            for hit in hits
        )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


class PythonTool(Tool):
    """Runs model-written Python in ``esbox.adapters.agents.sandbox`` and shows what it printed."""

    name = "python"
    description = (
        "Run a Python 3 program in a sandbox (no network, no files kept) and return what it "
        "prints; use print() for every value you want to see."
    )
    parameters = _string_argument("code", "the complete program")

    def __init__(self, sandbox: Sandbox | None = None) -> None:
        if sandbox is None:
            from esbox.adapters.agents.sandbox import Sandbox

            sandbox = Sandbox()
        self.sandbox = sandbox

    def __call__(self, code: str) -> str:
        result = self.sandbox.run(code)
        if result.error is not None:  # an exception or a limit hit: counted as a tool error
            raise ToolError(result.as_text())
        return result.as_text()
