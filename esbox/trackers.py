"""Trackers beside the JSONL log: TensorBoard event files and Weights & Biases runs.

A tracker is a Runner callback ``tracker(runner, metrics)`` that logs the numbers of the step's
JSONL record (non-finite values, which the JSONL holds as null, are left out) at the step
number of that record. TensorBoard and wandb are optional packages, imported when a tracker
is built; a missing one is a ConfigError naming the package to install.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from esbox.config import build_options, option
from esbox.errors import ConfigError
from esbox.tracking import record

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
WANDB_ID_FILE = "esbox-run-id"  # in RUN_DIR/wandb: a resumed run continues the same wandb run


@dataclass
class WandbOptions:
    """The ``tracking.wandb`` mapping: which Weights & Biases project the run logs to."""

    project: str = option("esbox", "wandb project")
    entity: str | None = option(None, "wandb team or user (null: your default)")
    name: str | None = option(None, "run name (null: the run directory's name)")
    tags: list[str] = option([], "run tags")
    mode: str = option(
        "offline",
        "offline: write RUN_DIR/wandb, upload later with `wandb sync`; online: stream",
        choices=("offline", "online"),
    )


def resolve_wandb(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``tracking.wandb`` with every default filled in; ``{}`` (wandb off) stays ``{}``."""
    if not raw:
        return {}
    return asdict(build_options(WandbOptions, dict(raw), where="tracking.wandb key"))


@dataclass
class TrackingConfig:
    """The ``tracking`` section of a run config: where metrics go besides metrics.jsonl."""

    tensorboard: bool = option(
        False, "also write the metrics as TensorBoard scalars to RUN_DIR/tensorboard"
    )
    wandb: dict = option(
        {},
        "also log them to Weights & Biases, e.g. {project: NAME} (offline into RUN_DIR/wandb "
        "unless mode: online; keys: project, entity, name, tags, mode); {}: off",
    )

    def __post_init__(self) -> None:
        self.wandb = resolve_wandb(self.wandb)


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a step's JSONL record, what every tracker logs (no booleans, no nulls)."""
    return {
        key: float(value)
        for key, value in record(metrics).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def _require(module: str, package: str, key: str) -> Any:
    """Import ``module`` (which needs ``package``); a ConfigError naming ``key`` if missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(_missing(key, package)) from None


def _missing(key: str, package: str) -> str:
    return f"{key} needs the {package} package: pip install {package} (part of esbox[tracking])"


class TensorBoardTracker:
    """Writes every step's scalars to TensorBoard event files in ``log_dir``.

    ``purge_step``: on a resume, the first step run again; TensorBoard hides the events the
    interrupted run had written from that step on, so each step appears once.
    """

    def __init__(self, log_dir: str | os.PathLike, *, purge_step: int | None = None) -> None:
        board = _require("torch.utils.tensorboard", "tensorboard", "tracking.tensorboard")
        self.writer = board.SummaryWriter(str(log_dir), purge_step=purge_step or None)

    def __call__(self, runner: Any, metrics: Mapping[str, Any]) -> None:
        step = int(metrics["step"])
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a killed run keeps every finished step, as the JSONL does

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """Logs every step's scalars to a Weights & Biases run (offline by default) in RUN_DIR/wandb.

    The run's id is kept in RUN_DIR/wandb, so ``esbox resume`` continues the same wandb run
    (wandb drops the re-run steps it already holds: a resume repeats them bit-identically).
    """

    def __init__(
        self, options: Mapping[str, Any], run_dir: str | os.PathLike, config: Mapping[str, Any]
    ) -> None:
        wandb = _require("wandb", "wandb", "tracking.wandb")
        opts = WandbOptions(**resolve_wandb(options))
        run_dir = Path(run_dir)
        id_file = run_dir / WANDB_DIR / WANDB_ID_FILE
        id_file.parent.mkdir(parents=True, exist_ok=True)
        if not id_file.is_file():
            id_file.write_text(secrets.token_hex(4) + "\n")
        self.run = wandb.init(
            project=opts.project,
            entity=opts.entity,
            name=opts.name or run_dir.name,
            tags=list(opts.tags),
            config=dict(config),
            dir=str(run_dir),
            mode=opts.mode,
            id=id_file.read_text().strip(),
            resume="allow",
            settings=wandb.Settings(console="off", silent=True),
        )

    def __call__(self, runner: Any, metrics: Mapping[str, Any]) -> None:
        self.run.log(scalars(metrics), step=int(metrics["step"]))

    def close(self) -> None:
        self.run.finish()


def check_trackers(tracking: TrackingConfig) -> None:
    """ConfigError now, before a run directory exists, when a tracker's package is missing."""
    wanted = {"tracking.tensorboard": tracking.tensorboard, "tracking.wandb": tracking.wandb}
    for key, on in wanted.items():
        package = key.removeprefix("tracking.")
        if on and importlib.util.find_spec(package) is None:
            raise ConfigError(_missing(key, package))


def open_trackers(
    tracking: TrackingConfig,
    run_dir: str | os.PathLike,
    *,
    first_step: int,
    config: Mapping[str, Any],
) -> list[TensorBoardTracker | WandbTracker]:
    """The trackers a run config's ``tracking`` section asks for, logging into ``run_dir``.

    ``first_step`` is the step the run starts (or resumes) at; ``config`` is the resolved
    config, recorded with the wandb run.
    """
    trackers: list[TensorBoardTracker | WandbTracker] = []
    try:
        if tracking.tensorboard:
            log_dir = Path(run_dir) / TENSORBOARD_DIR
            trackers.append(TensorBoardTracker(log_dir, purge_step=first_step))
        if tracking.wandb:
            trackers.append(WandbTracker(tracking.wandb, run_dir, config))
    except BaseException:  # wandb missing after the TensorBoard writer opened: close it
        for tracker in trackers:
            tracker.close()
        raise
    return trackers
