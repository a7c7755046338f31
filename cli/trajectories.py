"""``esbox trajectories``: an agent run's sampled conversations, a step and member at a time, or
the held-out conversations ``esbox evaluate --trajectories`` wrote, a question at a time."""

from __future__ import annotations

from pathlib import Path

import click

from esbox.cli.errors import CLIError


@click.command("trajectories")
@click.argument("run_dir", metavar="RUN_DIR|FILE", type=click.Path(path_type=Path))
@click.option(
    "--step", type=int, default=-1, show_default=True,
    help="step to show; negative counts back from the last step logged (-1: the last)",
)  # fmt: skip
@click.option("--member", type=int, default=None, help="population member (default: all)")
@click.option("--limit", type=int, default=4, show_default=True, help="at most this many")
@click.option(
    "--index", type=int, default=None,
    help="with an esbox evaluate file: the held-out question (default: all)",
)  # fmt: skip
@click.option("--system", "show_system", is_flag=True, help="print the system prompt once first")
def trajectories(
    run_dir: Path, step: int, member: int | None, limit: int, index: int | None, show_system: bool
) -> None:
    """Print the conversations an agent run logged (RUN_DIR/trajectories.jsonl), or those of a
    FILE that `esbox evaluate --trajectories` wrote (a trained model on held-out questions).

    Each one shows the gold answer, the model's final answer, its turns, tokens, tool calls
    (valid and not), tool errors, why it stopped and its reward, then every message: the model's
    turns and the tool results it read. An AHD run logs the heuristics it scored instead: each
    with its example, reward, cost against the reference, error and code.

    \b
    Examples:
      esbox trajectories runs/agent-math-copes             # the last step, 4 conversations
      esbox trajectories runs/agent-math-copes --step 0 --member 3
      esbox trajectories runs/agent-math-copes --system    # also the tool prompt
      esbox evaluate runs/agent-math-copes --base --limit 20 --trajectories held-out
      esbox trajectories held-out/agent-math-copes.jsonl --index 0   # question 0, trained
      esbox trajectories held-out/base.jsonl --index 0               # and untrained
    """
    from esbox.adapters.agents.config import TRAJECTORIES_FILE
    from esbox.adapters.agents.transcript import (
        format_trajectory,
        read_trajectories,
        system_prompt_of,
    )

    path = run_dir if run_dir.is_file() else run_dir / TRAJECTORIES_FILE
    if not path.is_file():
        raise CLIError(f"{path} does not exist: trajectories are logged by runs with problem.agent")
    try:
        records = read_trajectories(path)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if records and all("step" not in r for r in records):  # esbox evaluate's: one a question
        chosen = [r for r in records if index is None or r.get("index") == index]
        if not chosen:
            logged = f"questions {records[0].get('index')}..{records[-1].get('index')}"
            raise CLIError(f"no trajectory for question {index} in {path} (logged: {logged})")
    else:
        chosen = _run_records(path, records, step, member, index)
    if show_system:
        click.echo(f"-- system\n{system_prompt_of(chosen[0]).rstrip()}\n")
    click.echo("\n\n".join(format_trajectory(r) for r in chosen[:limit]))


def _run_records(
    path: Path, records: list[dict], step: int, member: int | None, index: int | None
) -> list[dict]:
    """The records of a run's ``step`` and ``member``; a CLIError says what was logged."""
    from esbox.adapters.agents.transcript import is_heuristic, select

    if index is not None:
        raise CLIError(
            "--index picks a question of a file that esbox evaluate --trajectories wrote; a run's "
            "trajectories are picked by --step and --member"
        )
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
    return chosen
