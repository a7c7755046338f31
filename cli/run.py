"""One run of the ``esbox`` command: build it from a resolved config, run it, write its files.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl``,
``checkpoints/``, the best parameters and, once the run stops, ``summary.json`` (and
``best_context.txt`` when the strategy co-evolves contexts); ``tensorboard/`` and ``wandb/``
when the config's ``tracking`` section asks for them.
"""

from __future__ import annotations

import json
import os
import shutil
import string
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click

import esbox
from esbox.adapters.problems import runs
from esbox.adapters.problems.runs import Session
from esbox.adapters.scale import PoolError
from esbox.cli.errors import CLIError, RunFailed, user_errors
from esbox.cli.interrupts import guarded
from esbox.cli.progress import ProgressBar
from esbox.errors import ConfigWarning, RewardError
from esbox.runconfig import RunConfig, dumps_yaml, load_yaml, to_dict
from esbox.runner import Runner
from esbox.strategy import Strategy
from esbox.trackers import check_trackers, open_trackers
from esbox.tracking import MetricsLogger, jsonable

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CONTEXT_FILE = "best_context.txt"
CHECKPOINTS = "checkpoints"
PLACEHOLDERS = ("strategy", "problem", "seed", "time")


def resolve_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw config (CLIError on bad values)."""
    with user_errors():
        return runs.resolve_config(raw)


def check_strategy(config: RunConfig) -> None:
    """Check the strategy's options and their fit with the problem, before anything loads."""
    with user_errors():
        runs.check_strategy(config)


def prepare(config: RunConfig) -> Session:
    """Build the problem, strategy and budget of ``config`` (CLIError on bad values)."""
    with user_errors(), config_warnings():
        check_trackers(config.tracking)
        return runs.build_session(config)


def dry_run(config: RunConfig) -> None:
    """Check ``config`` as a real run would, building what is cheap; evaluate nothing."""
    with user_errors(), config_warnings():
        check_trackers(config.tracking)
        runs.dry_run(config)


@contextmanager
def config_warnings() -> Iterator[None]:
    """Print each ConfigWarning raised inside as one ``warning: ...`` line on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        yield
    for warning in caught:
        if issubclass(warning.category, ConfigWarning):
            click.echo(f"warning: {warning.message}", err=True)
        else:
            warnings.showwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )


# -- run directories ----------------------------------------------------------------------------
def _fill(template: str, config: RunConfig, stamp: str) -> str:
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    for name in names:
        if name not in PLACEHOLDERS:
            allowed = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
            raise CLIError(f"output.dir: unknown placeholder {{{name}}} (allowed: {allowed})")
    problem = str(config.problem.get("name") or config.problem["kind"])
    return template.format(
        strategy=_safe(config.strategy), problem=_safe(problem), seed=config.seed, time=stamp
    )


def _safe(name: str) -> str:
    """``name`` as a path component: ``ng:NGOpt`` -> ``ng_NGOpt``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _is_run_dir(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() or (path / METRICS_FILE).is_file()


def make_run_directory(config: RunConfig, *, overwrite: bool) -> Path:
    """Create the run directory; an existing one is never reused silently.

    A templated name with ``{time}`` gets a ``-2``, ``-3``... suffix when taken; an explicit
    one is an error unless ``overwrite`` (and then only an esbox run directory is replaced).
    """
    template = config.output.dir
    path = Path(_fill(template, config, datetime.now().strftime("%Y%m%d-%H%M%S")))
    if path.exists() and not path.is_dir():
        raise CLIError(f"output.dir: {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        if overwrite:
            if not _is_run_dir(path):
                raise CLIError(f"refusing to overwrite {path}: it is not an esbox run directory")
            shutil.rmtree(path)
        elif "{time}" in template:
            base, n = path, 2
            while path.exists():
                path, n = base.with_name(f"{base.name}-{n}"), n + 1
        else:
            raise CLIError(
                f"run directory {path} already exists; choose another --out "
                f"or pass --overwrite to replace it"
            )
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_config(directory: Path, config: RunConfig) -> None:
    header = (
        f"Resolved by esbox {esbox.__version__} on {datetime.now().isoformat(timespec='seconds')}."
        "\nRe-run with: esbox optimize --config THIS_FILE"
    )
    _write_atomic(directory / CONFIG_FILE, dumps_yaml(config, header))


def read_config(directory: Path) -> dict[str, Any]:
    """The raw config saved in a run directory (CLIError when it is not a run directory)."""
    if not directory.is_dir():
        raise CLIError(f"run directory {directory} does not exist")
    if not (directory / CONFIG_FILE).is_file():
        raise CLIError(f"{directory} has no {CONFIG_FILE}: is it an esbox run directory?")
    with user_errors():
        return load_yaml(directory / CONFIG_FILE)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def remove_partial_files(directory: Path) -> None:
    """Delete the temporary files of run-directory writes that a kill cut short."""
    for name in (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, CONTEXT_FILE):
        for path in directory.glob(f".{name}.*"):
            path.unlink()


# -- running --------------------------------------------------------------------------------------
def execute(session: Session, directory: Path, *, quiet: bool, resume: bool) -> dict[str, Any]:
    """Run (or continue) the session in ``directory``; returns the summary it writes."""
    config = session.config
    if session.problem.start is not None:
        session.problem.start(directory)
    logger = MetricsLogger(directory / METRICS_FILE)
    runner = session.runner(
        callbacks=[logger],
        checkpoint_dir=directory / CHECKPOINTS,
        checkpoint_every=config.checkpoint.every,
        keep_checkpoints=config.checkpoint.keep,
    )
    if resume:
        remove_partial_files(directory)
        with user_errors("cannot resume: "):
            runner.resume(directory / CHECKPOINTS)
        logger.rewrite(runner.completed_history)  # a step cut short is logged by its callbacks
    first_step = len(runner.completed_history)
    with user_errors():
        trackers = open_trackers(
            config.tracking, directory, first_step=first_step, config=to_dict(config)
        )
    population = session.strategy.options.population
    bar = ProgressBar(session.budget, population, session.strategy.step, quiet=quiet)
    runner.callbacks.extend([*trackers, bar])
    error = None
    try:
        with guarded(runner):
            reason = runner.run()
    except KeyboardInterrupt:  # the step that was ending is checkpointed: log it too
        reason = "interrupted"
        logger.rewrite(runner.history)
    except RewardError as exc:  # the objective is broken: stop, keep what was done, exit 3
        reason, error = "bad_rewards", str(exc)
    except PoolError as exc:  # workers lost beyond scale.retries: the last checkpoint stands
        reason, error = "pool_failed", f"{exc}; continue with: esbox resume {directory}"
    finally:
        bar.close()
        logger.close()
        for tracker in trackers:
            tracker.close()
    summary = write_summary(session, runner, directory, reason, resumed=resume, error=error)
    return summary


def write_summary(
    session: Session,
    runner: Runner,
    directory: Path,
    reason: str,
    *,
    resumed: bool,
    error: str | None = None,
) -> dict[str, Any]:
    """Save the best parameters and ``summary.json``; returns the summary."""
    saved = {**session.problem.save(directory), **save_contexts(session.strategy, directory)}
    for callback in session.problem.callbacks:
        if getattr(callback, "baseline", None):
            saved["baseline"] = dict(callback.baseline)
    seconds = runner.elapsed
    failed = {"interrupted": "interrupted", "bad_rewards": "failed", "pool_failed": "failed"}
    status = failed.get(reason, "finished")
    summary = {
        "status": status,
        "stop_reason": reason,
        "strategy": session.config.strategy,
        "problem": session.problem.label,
        "seed": session.config.seed,
        "steps": session.strategy.step,
        "evaluations": runner.evaluations,
        "best_reward": session.strategy.best_reward,
        "restarts": [dict(r) for r in getattr(session.strategy, "restart_log", ())],
        **saved,
        "wall_seconds": seconds,
        "evaluations_per_second": runner.evaluations / seconds if seconds > 0 else None,
        "resumed": resumed,
        "run_dir": str(directory),
        "esbox_version": esbox.__version__,
        **({"error": error} if error else {}),
    }
    summary = jsonable(summary)
    _write_atomic(directory / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return summary


def save_contexts(strategy: Strategy, directory: Path) -> dict[str, Any]:
    """Write the best co-evolved context to ``best_context.txt``; summary fields of all of them."""
    best = getattr(strategy, "best_context", None)
    if best is None:
        return {}
    _write_atomic(directory / CONTEXT_FILE, best + "\n")
    contexts = zip(strategy.contexts, strategy.context_scores, strict=True)
    return {
        "best_context": best,
        "contexts": [{"text": text, "score": score} for text, score in contexts],
    }


def summary_line(summary: dict[str, Any]) -> str:
    """One line: what ran, the best value, the effort, why it stopped, where it is."""
    best = summary.get("best_value", summary.get("best_reward"))
    best_text = "n/a" if best is None else f"{best:.6g}"
    return (
        f"{summary['strategy']} on {summary['problem']}: best {best_text} after "
        f"{summary['steps']} steps, {summary['evaluations']} evaluations in "
        f"{summary['wall_seconds']:.1f} s ({summary['stop_reason']}) -> {summary['run_dir']}"
    )


def finish(summary: dict[str, Any]) -> None:
    """Print the summary line; an interrupted run says how to resume and exits with 130, a run
    whose objective gave no usable reward exits with 3."""
    if summary["status"] == "failed":
        raise RunFailed(f"{summary['error']} (run directory: {summary['run_dir']})")
    click.echo(summary_line(summary))
    if "best_context" in summary:
        preview = " ".join(summary["best_context"].split())
        preview = preview if len(preview) <= 60 else preview[:59] + "…"
        click.echo(f"best context ({Path(summary['run_dir']) / CONTEXT_FILE}): {preview}")
    if summary["status"] == "interrupted":
        click.echo(
            f"Interrupted; checkpoint saved. Continue with: esbox resume {summary['run_dir']}",
            err=True,
        )
        raise SystemExit(130)
