"""``esbox trajectories``: an agent run's sampled conversations, a step and member at a time."""

from __future__ import annotations

from pathlib import Path

import click

from esbox.cli.errors import CLIError


@click.command("trajectories")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--step", type=int, default=-1, show_default=True,
    help="step to show; negative counts back from the last step logged (-1: the last)",
)  # fmt: skip
@click.option("--member", type=int, default=None, help="population member (default: all)")
@click.option("--limit", type=int, default=4, show_default=True, help="at most this many")
@click.option("--system", "show_system", is_flag=True, help="print the system prompt once first")
def trajectories(
    run_dir: Path, step: int, member: int | None, limit: int, show_system: bool
) -> None:
    """Print the conversations an agent run logged (RUN_DIR/trajectories.jsonl).

    Each one shows the gold answer, the model's final answer, its turns, tokens, tool calls
    (valid and not), tool errors, why it stopped and its reward, then every message: the model's
    turns and the tool results it read. An AHD run logs the heuristics it scored instead: each
    with its example, reward, cost against the reference, error and code.

    \b
    Examples:
      esbox trajectories runs/agent-math-copes             # the last step, 4 conversations
      esbox trajectories runs/agent-math-copes --step 0 --member 3
      esbox trajectories runs/agent-math-copes --system    # also the tool prompt
    """
    from esbox.adapters.agents.config import TRAJECTORIES_FILE
    from esbox.adapters.agents.transcript import (
        format_trajectory,
        is_heuristic,
        read_trajectories,
        select,
        system_prompt_of,
    )

    path = run_dir / TRAJECTORIES_FILE
    if not path.is_file():
        raise CLIError(f"{path} does not exist: trajectories are logged by runs with problem.agent")
    try:
        records = read_trajectories(path)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if member is not None and records and all(is_heuristic(r) for r in records):
        raise CLIError(
            f"{path} holds an AHD run's heuristics, one record per code and example, not "
            "members' conversations: drop --member"
        )
    chosen = select(records, step=step, member=member)
    if not chosen:
        steps = sorted({r["step"] for r in records})
        logged = f"steps {steps[0]}..{steps[-1]}" if steps else "nothing yet"
        who = f", member {member}" if member is not None else ""
        raise CLIError(f"no trajectory for step {step}{who} in {path} (logged: {logged})")
    if show_system:
        click.echo(f"-- system\n{system_prompt_of(chosen[0]).rstrip()}\n")
    click.echo("\n\n".join(format_trajectory(r) for r in chosen[:limit]))
