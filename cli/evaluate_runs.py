"""``esbox evaluate RUN_DIR [RUN_DIR ...] [--base]``: trained runs (ES or GRPO) and the model they
started from, on the same held-out questions with the same sampling, side by side: accuracy
with its SE, the paired change against the first model, questions gained and lost."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from tqdm.auto import tqdm

from esbox.cli.errors import CLIError, user_errors

BASE = "base"


@dataclass
class Settings:
    """How every model is scored (the command's flags)."""

    base: bool
    split: str
    limit: int | None
    samples: int
    dtype: str | None
    device: str
    batch_size: int
    out: Path | None
    trajectories: Path | None


@dataclass
class Scored:
    """One evaluated model: its row name, run directory (None for the base), the context it
    read (a contexts run's best one) and score."""

    name: str
    run: Path | None
    model: str
    context: str | None
    score: Any


def evaluate_runs(run_dirs: tuple[Path, ...], settings: Settings) -> None:
    """Score each run's ``model/`` (and with ``base`` the model they started from) with the
    runs' shared task, agent and dtype, a run that co-evolved contexts with its best one; print
    the table, write JSON and trajectories."""
    from esbox.adapters.agents.config import agent_options
    from esbox.adapters.problems import resolve_model_path
    from esbox.adapters.problems.trained_runs import SHARED_KEYS, check_comparable, read_run
    from esbox.adapters.tasks import load_task

    with user_errors():
        runs = [read_run(path) for path in run_dirs]
        keys = SHARED_KEYS if settings.dtype is None else tuple(k for k in SHARED_KEYS
                                                                if k != "dtype")  # fmt: skip
        check_comparable(runs, keys)
        problem = runs[0].problem
        agent = agent_options(problem["agent"]) if problem["agent"] else None
        task = load_task(problem["task"])
    examples = task.split(settings.split)[: settings.limit]
    if not examples:
        raise CLIError(f"the task's {settings.split} split has no questions")
    if agent is not None and any(isinstance(e.prompt, str) for e in examples):
        raise CLIError("the runs' problem.agent needs chat prompts: the task's chat option is off")
    if settings.trajectories is not None and agent is None:
        raise CLIError("--trajectories writes agent trajectories: the runs have no problem.agent")
    models = [(r.path.name, r.path, str(r.model), r.context) for r in runs]
    if settings.base:
        with user_errors():
            models.insert(0, (BASE, None, resolve_model_path(problem["model"]), None))
    names = [name for name, *_ in models]
    if settings.trajectories is not None and len(set(names)) < len(names):
        raise CLIError(f"--trajectories: two models would write the same file ({names})")
    if settings.trajectories is not None and settings.trajectories.is_file():
        raise CLIError(f"--trajectories: {settings.trajectories} is a file, not a directory")
    dtype = settings.dtype or problem["dtype"]
    max_new_tokens = problem["max_new_tokens"] or None
    scored = []
    for i, (name, run, model, context) in enumerate(models):
        if context is not None:
            click.echo(f"note: {name} reads its best context (best_context.txt)", err=True)
        score = _score(model, name, task, examples, agent, dtype, max_new_tokens, settings,
                       i == 0, context)  # fmt: skip
        scored.append(Scored(str(run) if run is not None else name, run, model, context, score))
        if settings.trajectories is not None:
            _write_trajectories(settings.trajectories / f"{name}.jsonl", score.records)
    from esbox.cli.compare_table import comparison, table

    rows = comparison([(s.name, s.score) for s in scored])
    click.echo(table(rows))
    if settings.out is not None:
        record = _record(problem, settings, dtype, scored, rows)
        settings.out.write_text(json.dumps(record, indent=2, ensure_ascii=False))


def _score(
    model: str,
    name: str,
    task: Any,
    examples: list[Any],
    agent: Any,
    dtype: str,
    max_new_tokens: int | None,
    settings: Settings,
    first: bool,
    context: str | None,
) -> Any:
    """Load one model, score it (read after ``context``, if any), let it go (the first one
    says which sandbox runs python)."""
    from esbox.adapters.generation import HFBackend
    from esbox.adapters.models import load_model
    from esbox.adapters.problems.scoring import score_model

    try:
        loaded, tokenizer = load_model(model, dtype=dtype, device=settings.device)
    except (ValueError, ImportError, OSError) as exc:
        raise CLIError(f"{name}: {exc}") from None
    bar = tqdm(total=len(examples), unit="question", desc=name, dynamic_ncols=True,
               leave=False, disable=None)  # fmt: skip
    with bar, user_errors(f"{name}: "):
        return score_model(
                task, examples, HFBackend(loaded, tokenizer), agent=agent,
                samples=settings.samples, batch_size=settings.batch_size,
                max_new_tokens=max_new_tokens, progress=bar.update,
                note=(lambda text: click.echo(f"note: {text}", err=True)) if first else None,
                context=context,
            )  # fmt: skip


def _write_trajectories(path: Path, records: list[dict[str, Any]] | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records or [])


def _record(
    problem: dict[str, Any],
    settings: Settings,
    dtype: str,
    scored: list[Scored],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """What ``--out`` writes: the shared settings, and per model its figures, the paired change
    against the first model and each question's correctness."""
    shared = {key: problem[key] for key in ("model", "task", "agent", "max_new_tokens")}
    return {
        "runs": [str(s.run) for s in scored if s.run is not None],
        "split": settings.split, "limit": settings.limit, "samples": settings.samples,
        "dtype": dtype, "problem": shared, "reference": scored[0].name,
        "models": [
            {"name": s.name, "run": None if s.run is None else str(s.run), "model": s.model,
             "context": s.context, **row["figures"], "accuracy_se": row["accuracy_se"],
             "vs_reference": row["change"], "correct": s.score.correct}
            for s, row in zip(scored, rows, strict=True)
        ],
    }  # fmt: skip
