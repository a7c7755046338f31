"""The ``esbox`` command: optimize, resume, report, strategies, and the LLM commands."""

from __future__ import annotations

from typing import Any

import click

import esbox
from esbox.cli.errors import CLIError
from esbox.cli.evaluate import evaluate_cmd
from esbox.cli.grpo import grpo
from esbox.cli.heuristics import heuristics
from esbox.cli.llm_commands import convert_model, memory_cmd
from esbox.cli.optimize import optimize
from esbox.cli.report import report
from esbox.cli.resume import resume
from esbox.cli.strategies_cmd import strategies
from esbox.cli.tasks_cmd import tasks
from esbox.cli.trajectories import trajectories
from esbox.errors import ConfigError, ResumeError


class _Group(click.Group):
    """Bad input that slips past a command's own checks still exits 2 without a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ConfigError, ResumeError) as exc:
            raise CLIError(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(esbox.__version__, prog_name="esbox")
def cli() -> None:
    """esbox: Evolution Strategies for black-box functions and LLM post-training.

    \b
    Quick start:
      esbox optimize --strategy copes      # a built-in demo problem, into runs/
      esbox report runs/copes-*            # plots + a table of final figures
      esbox resume RUN_DIR                 # continue an interrupted run
      esbox strategies                     # strategies and their options
      esbox tasks reasoning_gym            # task kinds, datasets, games
      esbox evaluate --model smollm2       # score an LLM on a task
      esbox evaluate RUN_DIR ... --base    # trained runs against their base model
      esbox trajectories RUN_DIR           # an agent run's conversations
    """


cli.add_command(optimize)
cli.add_command(grpo)
cli.add_command(resume)
cli.add_command(report)
cli.add_command(strategies)
cli.add_command(tasks)
cli.add_command(evaluate_cmd)
cli.add_command(convert_model)
cli.add_command(memory_cmd)
cli.add_command(trajectories)
cli.add_command(heuristics)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="esbox")


if __name__ == "__main__":
    main()
