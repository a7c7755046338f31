"""``esbox grpo``: GRPO (full or LoRA) on TRL from an esbox run config, into a run directory."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from esbox.cli.budget_from import apply_overrides_with_budget, budget_from_options
from esbox.cli.errors import CLIError, user_errors
from esbox.cli.run import make_run_directory
from esbox.runconfig import apply_overrides, dumps_yaml, load_yaml

EPILOG = """\b
Examples:
  esbox grpo --config examples/llm-arith-grpo.yaml
  esbox grpo --config examples/agent-math.yaml --set grpo.learning_rate=1e-6
  esbox grpo --config examples/llm-arith-grpo.yaml --set lora.r=8      # LoRA-GRPO
  esbox grpo --config run.yaml --dry-run      # check and print the resolved config
  esbox grpo --config examples/agent-math.yaml --budget-from runs/agent-math-copes

\b
The config is an ES run config (its strategy and options are ignored) plus:
  grpo.*    trl.GRPOConfig keys (num_generations, learning_rate, temperature, beta, ...)
  lora.*    peft.LoraConfig keys (r, lora_alpha, target_modules, ...); present: LoRA-GRPO
esbox sets the rest from the config: seed, budget.max_steps, problem.batch_size (prompts a
step), problem.max_new_tokens, checkpoint.every and keep, the run directory (docs/grpo.md).
"""


@click.command(epilog=EPILOG, short_help="Train by GRPO (TRL) from a run config, into a run dir.")
@click.option(
    "--config", "-c", "config_path", required=True,
    type=click.Path(dir_okay=False, path_type=Path), help="YAML run config; --set overrides it.",
)  # fmt: skip
@click.option("--seed", type=int, help="Run seed (overrides the config's `seed`).")
@click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a config key by its dotted path; VALUE is YAML. Repeatable.",
)  # fmt: skip
@click.option("--out", "-o", help="Run directory (overrides `output.dir`).")
@click.option("--overwrite", is_flag=True, help="Replace an existing run directory.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--dry-run", is_flag=True, help="Check and print the resolved config; run nothing.")
@budget_from_options
def grpo(
    config_path: Path,
    seed: int | None,
    overrides: tuple[str, ...],
    out: str | None,
    overwrite: bool,
    quiet: bool,
    dry_run: bool,
    budget_from: Path | None,
    budget_at: str,
) -> None:
    """Post-train the config's model on its task by GRPO (TRL's GRPOTrainer; peft for LoRA).

    Writes the run directory an ES run writes: config.yaml, metrics.jsonl, checkpoints/ (TRL's),
    model/ and summary.json; `esbox resume RUN_DIR` continues it, `esbox report` plots it.
    """
    from esbox.adapters.rl import load_grpo_config

    with user_errors():
        raw = apply_overrides_with_budget(
            load_yaml(config_path), list(overrides), budget_from, budget_at
        )
        if seed is not None:
            raw["seed"] = seed
        if out is not None:
            raw["output"] = {**(raw.get("output") or {}), "dir": out}
        run = load_grpo_config(raw)
    if dry_run:
        click.echo(dumps_yaml(run.to_dict()), nl=False)
        return
    config = run.config
    directory = make_run_directory(_named(config, run.method), overwrite=overwrite)
    write_run_config(directory, run)
    train(run, directory, quiet=quiet, resume=False)


def _named(config: Any, method: str) -> Any:
    """The config with the method as its strategy, so ``{strategy}`` in output.dir names it."""
    import dataclasses

    return dataclasses.replace(config, strategy=method)


def write_run_config(directory: Path, run: Any) -> None:
    """``config.yaml`` of a GRPO run; ``esbox resume`` tells it from an ES run's by ``grpo:``."""
    header = "Re-run with: esbox grpo --config THIS_FILE"
    (directory / "config.yaml").write_text(dumps_yaml(run.to_dict(), header), encoding="utf-8")


def train(run: Any, directory: Path, *, quiet: bool, resume: bool) -> None:
    """Build and train (or continue) the run; print its line, exit 130 when interrupted."""
    from esbox.adapters.rl.training import GRPOTraining

    with user_errors():
        training = GRPOTraining(run, directory)
    training.add_callback(_bar(run, quiet))
    with user_errors("cannot resume: " if resume else ""), _stopping(training.log):
        summary = training.run(resume=resume)
    best = summary["best_reward"]
    click.echo(
        f"{summary['strategy']} on {summary['problem']}: best reward "
        f"{'n/a' if best is None else f'{best:.6g}'} after {summary['steps']} steps, "
        f"{summary['samples']} samples in {summary['wall_seconds']:.1f} s "
        f"({summary['stop_reason']}) -> {directory}"
    )
    if summary["status"] == "interrupted":
        click.echo(f"Interrupted; continue with: esbox resume {directory}", err=True)
        raise SystemExit(130)


@contextmanager
def _stopping(log: Any) -> Iterator[None]:
    """The first Ctrl-C or SIGTERM ends the run after the current step, with a checkpoint; a
    second one stops at once (the last checkpoint stands)."""

    def handler(signum: int, frame: Any) -> None:
        if log.stop_reason == "interrupted":
            raise KeyboardInterrupt
        log.request_stop()
        click.echo("\nstopping after this step (again to stop now)...", err=True)

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def _bar(run: Any, quiet: bool) -> Any:
    """A progress bar over the optimizer steps, showing the step's mean reward."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class Bar(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar = tqdm(
                total=state.max_steps,
                initial=state.global_step,
                unit="step",
                dynamic_ncols=True,
                disable=True if quiet else None,
                leave=False,
            )

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "train_runtime" not in logs:
                self.bar.update(state.global_step - self.bar.n)
                reward = (logs or {}).get("reward")
                if reward is not None:
                    self.bar.set_postfix({"reward": f"{reward:.3g}"})

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar.close()

    return Bar()


def resume_grpo(
    run_dir: Path, raw: dict[str, Any], overrides: tuple[str, ...], quiet: bool
) -> None:
    """``esbox resume`` of a GRPO run: its config (budget and checkpoint changes allowed)."""
    from esbox.adapters.rl import read_grpo_config

    with user_errors():
        run = read_grpo_config(apply_overrides(raw, overrides))
    if overrides:
        write_run_config(run_dir, run)
    from esbox.adapters.rl.rundir import latest_checkpoint

    if latest_checkpoint(run_dir / "checkpoints") is None:  # before the model loads
        raise CLIError(
            f"cannot resume: {run_dir / 'checkpoints'} holds no complete checkpoint (the run "
            f"stopped before its first); re-run it with: esbox grpo --config "
            f"{run_dir / 'config.yaml'} --out {run_dir} --overwrite"
        )
    train(run, run_dir, quiet=quiet, resume=True)
