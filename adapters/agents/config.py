"""The ``problem.agent`` section of an LLM run: which tools, how long a trajectory may run, the
penalties; and the tools, loop, evaluator and validation it builds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esbox.adapters.tasks.base import Task
from esbox.config import build_options, option
from esbox.errors import ConfigError

from .evaluator import AgentEvaluator, AgentValidation, TrajectoryLog
from .loop import AgentLimits, AgentLoop
from .tools import Calculator, PythonTool, Search, Tool

TOOL_NAMES = ("calculator", "python", "search")
TRAJECTORIES_FILE = "trajectories.jsonl"


@dataclass
class AgentOptions:
    """Multi-turn tool use (``problem.agent``); an empty section means single-turn rollouts."""

    tools: list = option(
        ["calculator"],
        f"tools the agent may call: {', '.join(TOOL_NAMES)}, or your own as 'module:name' "
        "(a Tool, a Tool class or a typed function; docs/agents.md); may be [] when the "
        "trajectories play an environment",
    )
    environment: str = option(
        "",
        "an environment class (or factory) as 'module:name', one instance per trajectory, reset "
        "from the example's row: TRL's environment_factory convention (docs/environments.md); "
        "'' for the task's own (a textarena task has one) or none",
    )
    max_turns: int = option(4, "model turns per trajectory", minimum=1)
    max_tokens: int = option(384, "generated tokens per trajectory, all turns", minimum=1)
    max_new_tokens: int = option(128, "generated tokens per turn", minimum=1)
    invalid_call_penalty: float = option(0.0, "reward lost per malformed tool call", minimum=0.0)
    truncation_penalty: float = option(
        0.0, "reward lost when a trajectory ends without an answer", minimum=0.0
    )
    search_k: int = option(3, "passages the search tool returns", minimum=1)
    python_seconds: float = option(5.0, "wall-clock limit of one python tool call", minimum=0.1)
    log_per_member: int = option(
        1, "trajectories of each member written to trajectories.jsonl each step", minimum=0
    )
    prefill: str | list = option(
        "",
        "text the first turn starts with, e.g. an opened call '<tool_call>{\"name\": ...' "
        "(a scaffold for a model that never calls on its own; docs/agents.md), or a list: "
        "one text per turn ('' for none)",
        form="a string, or a list of strings (one per turn)",
    )
    native_template: str = option(
        "auto",
        "auto: the chat template's own tool format when it has one; text: always the "
        "<tool_call> text protocol",
        choices=("auto", "text"),
    )


def agent_options(section: dict[str, Any]) -> AgentOptions:
    """The options of a ``problem.agent`` mapping; ConfigError names a bad key or tool. ``tools``
    may be empty: trajectories that play an environment may need none."""
    options = build_options(AgentOptions, dict(section), where="problem.agent option")
    unknown = [t for t in options.tools if t not in TOOL_NAMES and not _is_import_path(t)]
    if options.environment:
        import_environment(options.environment)  # a typo fails here, before the model loads
    if unknown:
        raise ConfigError(
            f"problem.agent.tools must list some of {', '.join(TOOL_NAMES)} or 'module:name' "
            f"paths to your own tools, got {options.tools}"
        )
    if isinstance(options.prefill, list) and not all(isinstance(p, str) for p in options.prefill):
        raise ConfigError(
            f"problem.agent.prefill must be a string or a list of strings (one per turn), "
            f"got {options.prefill!r}"
        )
    for name in options.tools:
        if _is_import_path(name):
            import_tool(name)  # a typo fails here, before the model loads
    return options


def import_environment(path: str) -> Any:
    """The environment factory ``module:name`` names (a class, or any callable giving one)."""
    import importlib

    module_name, _, attribute = path.partition(":")
    where = f"problem.agent.environment: {path!r}"
    if not attribute:
        raise ConfigError(f"{where} must be 'module:name'")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{where} cannot be imported ({exc})") from None
    if not callable(found) or (isinstance(found, type) and not hasattr(found, "reset")):
        raise ConfigError(f"{where} is not an environment class (it needs a reset method)")
    return found


def _is_import_path(name: Any) -> bool:
    return isinstance(name, str) and ":" in name


def import_tool(path: str) -> Tool:
    """The tool that ``module:name`` names: a ``Tool``, a ``Tool`` subclass (built without
    arguments) or a typed function (wrapped by ``@tool``); ConfigError says what is wrong."""
    import importlib

    from .tools import tool

    module_name, _, attribute = path.partition(":")
    where = f"problem.agent.tools: {path!r}"
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{where} cannot be imported ({exc})") from None
    if isinstance(found, Tool):
        return found
    try:
        if isinstance(found, type) and issubclass(found, Tool):
            return found()
        if callable(found):
            return tool(found)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where} is not a usable tool ({exc})") from None
    raise ConfigError(f"{where} is a {type(found).__name__}, not a Tool, Tool class or function")


def make_tools(options: AgentOptions, task: Task) -> list[Tool]:
    """The tools ``options.tools`` names; ``search`` runs over the task's documents."""
    tools: list[Tool] = []
    for name in options.tools:
        if name == "calculator":
            tools.append(Calculator())
        elif name == "python":
            from .sandbox import Sandbox, SandboxLimits

            limits = SandboxLimits(wall_seconds=options.python_seconds)
            tools.append(PythonTool(Sandbox(limits)))
        elif name == "search":
            tools.append(Search(_corpus(task), k=options.search_k))
        else:
            tools.append(import_tool(name))
    return tools


def _corpus(task: Task) -> Any:
    from .retrieval import Corpus, Passage

    documents = getattr(task, "documents", None)
    if not documents:
        raise ConfigError(
            f"problem.agent.tools: search needs a task with documents (multihop_qa), "
            f"not {task.name}"
        )
    return Corpus(Passage(str(d["id"]), str(d["title"]), str(d["text"])) for d in documents)


@dataclass
class AgentParts:
    """What the LLM problem wires in for agent rollouts."""

    evaluator: AgentEvaluator
    validation: AgentValidation | None

    def start(self, directory: Path) -> None:
        """Sampled trajectories go to ``directory/trajectories.jsonl``."""
        self.evaluator.log = TrajectoryLog(Path(directory) / TRAJECTORIES_FILE)


def build_agent(
    options: AgentOptions,
    task: Task,
    backend: Any,
    *,
    seed: int,
    batch_size: int,
    greedy: bool,
    validation: dict[str, Any] | None,
    max_rows: int = 0,
) -> AgentParts:
    """The agent evaluator (and held-out validation when ``validation`` has its options)."""
    limits = AgentLimits(options.max_turns, options.max_tokens, options.max_new_tokens)
    native = False if options.native_template == "text" else None
    tools = make_tools(options, task)
    loop = AgentLoop(backend, tools, limits=limits, native=native, prefill=options.prefill)
    environment = import_environment(options.environment) if options.environment else None
    evaluator = AgentEvaluator(
        task,
        loop,
        environment=environment,
        batch_size=batch_size,
        seed=seed,
        greedy=greedy,
        invalid_call_penalty=options.invalid_call_penalty,
        truncation_penalty=options.truncation_penalty,
        log_per_member=options.log_per_member,
        max_rows=max_rows,
    )
    checker = AgentValidation(task, evaluator, **validation) if validation is not None else None
    return AgentParts(evaluator, checker)
