"""``esbox evaluate``: score a model on a task split — single answers, or multi-turn tool-use
rollouts with ``--agent`` (accuracy, pass@k and the tool-use figures); or trained runs side by
side (:mod:`esbox.cli.evaluate_runs`)."""

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
@click.argument("run_dirs", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", default=None, help="local HF model directory, hub name, or 'smollm2'")
@click.option(
    "--base",
    is_flag=True,
    help="with RUN_DIRs: also the untrained model the runs started from (problem.model)",
)
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
    default=None,
    help="weight dtype (default: float32; with RUN_DIRs the runs' problem.dtype)",
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
    type=click.Path(path_type=Path),
    default=None,
    help="with --agent: write every trajectory to this JSONL file; with RUN_DIRs of agent "
    "runs: to DIR/<run>.jsonl (DIR/base.jsonl)",
)
@click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="torch CPU threads (0: torch's default)",
)
def evaluate_cmd(
    run_dirs: tuple[Path, ...],
    model: str | None,
    base: bool,
    task_text: str,
    split: str,
    limit: int | None,
    samples: int,
    max_new_tokens: int | None,
    dtype: str | None,
    device: str,
    batch_size: int,
    out: Path | None,
    agent_text: str | None,
    trajectories_path: Path | None,
    threads: int,
) -> None:
    """Score a model on a task split: accuracy, mean reward and unbiased pass@k; or trained
    runs (RUN_DIRs of esbox optimize or esbox grpo) side by side.

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

    With RUN_DIRs each run's model/ is scored with the task, agent settings, answer length and
    dtype of its config.yaml (the runs must agree on them), all on the same questions with the
    same sampling; --base adds the model they started from. One table: accuracy (SE), the
    change against the first model with its paired SE, questions gained and lost, pass@k and
    the tool-use figures:

    \b
      esbox evaluate runs/agent-math-copes runs/agent-math-openai_es --base --limit 300
    """
    if run_dirs:
        from esbox.cli.evaluate_runs import Settings, evaluate_runs

        _check_run_flags(model, max_new_tokens)
        settings = Settings(base, split, limit, samples, dtype, device, batch_size, out,
                            trajectories_path)  # fmt: skip
        _set_threads(threads)
        return evaluate_runs(run_dirs, settings)
    if base:
        raise CLIError("--base adds the start model of RUN_DIRs: give run directories")
    if model is None:
        raise CLIError("give --model MODEL, or run directories to compare: esbox evaluate RUN_DIR")
    from esbox.adapters.agents.config import agent_options
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.problems import resolve_model_path
    from esbox.adapters.problems.scoring import score_model
    from esbox.adapters.tasks import load_task

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
        _set_threads(threads)
        path = resolve_model_path(model)
        loaded, tokenizer = load_model(path, dtype=dtype or "float32", device=device)
    except (ValueError, ImportError, OSError) as exc:
        raise CLIError(str(exc)) from None
    total = len(examples)
    # a live bar on a terminal (tqdm stays silent when stderr is not one)
    bar = tqdm(total=total, unit="question", dynamic_ncols=True, leave=False, disable=None)
    with bar, user_errors("--agent: " if agent is not None else ""):
        score = score_model(
                task, examples, HFBackend(loaded, tokenizer), agent=agent, samples=samples,
                batch_size=batch_size, max_new_tokens=max_new_tokens, progress=bar.update,
                note=lambda text: click.echo(f"note: {text}", err=True),
            )  # fmt: skip
    figures = score.figures
    if trajectories_path is not None:
        with trajectories_path.open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in score.records or [])
    click.echo("| metric | value |\n|---|---|")
    for key, value in figures.items():
        click.echo(f"| {key} | {value:.4g} |")
    if out is not None:
        record: dict[str, Any] = {"model": model, "task": parse_task(task_text), "split": split}
        if agent_text is not None:
            record["agent"] = parse_agent(agent_text)
        out.write_text(json.dumps({**record, **figures}, indent=2))


def _check_run_flags(model: str | None, max_new_tokens: int | None) -> None:
    """With RUN_DIRs the model, task, agent and answer length come from the runs' configs."""
    source = click.get_current_context().get_parameter_source
    given = [f"--{n}" for n in ("task_text", "agent_text") if source(n).name == "COMMANDLINE"]
    if model is not None:
        given.insert(0, "--model")
    if max_new_tokens is not None:
        given.append("--max-new-tokens")
    if given:
        flag = given[0].replace("_text", "")
        raise CLIError(
            f"{flag} with RUN_DIRs: each run is scored with its own config.yaml (problem.model, "
            "task, agent, max_new_tokens); evaluate one model with --model instead"
        )


def _set_threads(threads: int) -> None:
    """torch's CPU threads (0: leave torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
