"""``esbox evaluate``: score a model on a task split — single answers, or multi-turn tool-use
rollouts with ``--agent`` (accuracy, pass@k and the tool-use figures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml
from tqdm.auto import tqdm

from esbox.cli.errors import CLIError, user_errors


def _yaml_flag(flag: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CLIError(f"{flag} is not valid YAML: {exc}") from None


def parse_task(text: str) -> dict[str, Any]:
    """``arithmetic`` or an inline YAML mapping such as ``{kind: math, path: test.jsonl}``."""
    value = _yaml_flag("--task", text)
    if isinstance(value, str):
        return {"kind": value}
    if not isinstance(value, dict) or "kind" not in value:
        raise CLIError(
            "--task must be a kind (arithmetic, math, qa, tool_math, multihop_qa, datasets) "
            "or a mapping with a 'kind' key, e.g. '{kind: math, path: test.jsonl}'"
        )
    return value


def parse_agent(text: str) -> dict[str, Any]:
    """``--agent``: a ``problem.agent`` mapping such as ``{tools: [python], max_turns: 4}``, or
    just the tools (``python``, ``[python, calculator]``)."""
    value = _yaml_flag("--agent", text)
    if isinstance(value, (str, list)):
        return {"tools": [value] if isinstance(value, str) else value}
    if not isinstance(value, dict) or not value:
        raise CLIError(
            "--agent must be a tool (python), a list of tools or a mapping of agent options, "
            "e.g. '{tools: [python], max_turns: 4}'"
        )
    return value


@click.command("evaluate")
@click.option("--model", required=True, help="local HF model directory, hub name, or 'smollm2'")
@click.option(
    "--task",
    "task_text",
    default="arithmetic",
    show_default=True,
    help="task kind or inline YAML mapping, e.g. '{kind: math, path: test.jsonl}'",
)
@click.option(
    "--split", type=click.Choice(["heldout", "train"]), default="heldout", show_default=True
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="score only the first N questions of the split",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="samples per question; pass@k is reported for k up to it",
)
@click.option(
    "--max-new-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="tokens per answer (default: the task's)",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
)
@click.option("--device", default="cpu", show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="also write the figures to this JSON file",
)
@click.option(
    "--agent",
    "agent_text",
    default=None,
    help="score multi-turn tool-use rollouts: agent options as in problem.agent, e.g. "
    "'{tools: [python], max_turns: 4}', or just a tool: python",
)
@click.option(
    "--trajectories",
    "trajectories_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="with --agent: write every trajectory to this JSONL file",
)
@click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="torch CPU threads (0: torch's default)",
)
def evaluate_cmd(
    model: str,
    task_text: str,
    split: str,
    limit: int | None,
    samples: int,
    max_new_tokens: int | None,
    dtype: str,
    device: str,
    batch_size: int,
    out: Path | None,
    agent_text: str | None,
    trajectories_path: Path | None,
    threads: int,
) -> None:
    """Score a model on a task split: accuracy, mean reward and unbiased pass@k.

    With --agent each question is a multi-turn tool-use rollout (docs/agents.md), scored on
    its final answer, and the tool-use figures join the table: tool-call rate (trajectories
    with a call), valid-call rate, turns and tokens per trajectory, tool errors (python:
    sandbox errors) and answer rate.

    \b
    Examples:
      esbox evaluate --model smollm2 --task arithmetic
      esbox evaluate --model runs/llm-arith/model --task arithmetic --samples 8
      esbox evaluate --model smollm2 --limit 200 \\
        --task '{kind: math, path: train.jsonl, heldout_path: test.jsonl}'
      esbox evaluate --model smollm2 --limit 50 --agent '{tools: [python], max_turns: 4}' \\
        --task '{kind: math, path: train.jsonl, heldout_path: test.jsonl, instruction: ""}'
    """
    from esbox.adapters.agents.config import agent_options
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.problems import resolve_model_path
    from esbox.adapters.tasks import evaluate, load_task

    agent = None
    if agent_text is not None:
        with user_errors("--agent: "):
            agent = agent_options(parse_agent(agent_text))
        if max_new_tokens is not None:
            raise CLIError(
                "with --agent the tokens per turn are an agent option: "
                "--agent '{..., max_new_tokens: T}' (and max_tokens per trajectory)"
            )
    elif trajectories_path is not None:
        raise CLIError("--trajectories needs --agent")
    try:
        task = load_task(parse_task(task_text))
        examples = task.split(split)[:limit]
        if agent is not None and any(isinstance(e.prompt, str) for e in examples):
            raise ValueError("--agent needs chat prompts: leave the task's chat option on")
        if threads:
            import torch

            torch.set_num_threads(threads)
        loaded, tokenizer = load_model(resolve_model_path(model), dtype=dtype, device=device)
    except (ValueError, ImportError, OSError) as exc:
        raise CLIError(str(exc)) from None
    total = len(examples)
    # a live bar on a terminal (tqdm stays silent when stderr is not one)
    with tqdm(total=total, unit="question", dynamic_ncols=True, leave=False, disable=None) as bar:
        if agent is not None:
            figures = _evaluate_agent(
                agent, task, examples, HFBackend(loaded, tokenizer), samples, batch_size,
                bar.update, trajectories_path,
            )  # fmt: skip
        else:
            figures = evaluate(
                task,
                HFBackend(loaded, tokenizer),
                split=split,
                limit=limit,
                num_samples=samples,
                max_new_tokens=max_new_tokens,
                batch_size=batch_size,
                progress=bar.update,
            )
    click.echo("| metric | value |\n|---|---|")
    for key, value in figures.items():
        click.echo(f"| {key} | {value:.4g} |")
    if out is not None:
        record: dict[str, Any] = {"model": model, "task": parse_task(task_text), "split": split}
        if agent_text is not None:
            record["agent"] = parse_agent(agent_text)
        out.write_text(json.dumps({**record, **figures}, indent=2))


def _evaluate_agent(
    options: Any,
    task: Any,
    examples: list[Any],
    backend: Any,
    samples: int,
    batch_size: int,
    progress: Any,
    trajectories_path: Path | None,
) -> dict[str, float]:
    """``esbox evaluate --agent``: the rollouts' figures; the trajectories to a JSONL file."""
    from esbox.adapters.agents.config import build_agent
    from esbox.adapters.agents.evaluator import evaluate_agent, trajectory_records

    with user_errors("--agent: "):
        parts = build_agent(
            options, task, backend, seed=0, batch_size=batch_size, greedy=samples == 1,
            validation=None,
        )  # fmt: skip
    loop = parts.evaluator.loop
    for tool in loop.tools.values():
        if hasattr(tool, "sandbox"):
            click.echo(f"note: {tool.name} tool: {tool.sandbox.describe()}", err=True)
    figures, trajectories = evaluate_agent(
        parts.evaluator, examples, num_samples=samples, batch_size=batch_size, progress=progress
    )
    if trajectories_path is not None:
        records = trajectory_records(task, loop, examples, trajectories)
        with trajectories_path.open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return figures
