"""Atomic checkpoints: tensors in safetensors, the rest in JSON; nothing is ever unpickled.

Layout: ``DIR/step-00000010/{tensors.safetensors,state.json}`` plus ``DIR/latest`` naming the
newest. A checkpoint is written to a temporary folder and renamed into place, and ``latest``
is replaced atomically, so a crash mid-write leaves the previous checkpoint intact (and a
temporary entry, which the next write or resume removes).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

LATEST = "latest"
HISTORY = "history.jsonl"


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def remove_partial_writes(directory: str | os.PathLike) -> None:
    """Delete what a write killed midway left in ``directory``: temporary checkpoint folders
    and the temporary files of ``latest`` and the history."""
    prefixes = (".step-", f".{LATEST}.", f".{HISTORY}.")
    root = Path(directory)
    for path in root.glob(".*") if root.is_dir() else ():
        if path.name.startswith(prefixes) and path.is_dir():
            shutil.rmtree(path)
        elif path.name.startswith(prefixes):
            path.unlink()


def save_checkpoint(
    directory: str | os.PathLike,
    step: int,
    tensors: dict[str, torch.Tensor],
    state: dict[str, Any],
    keep: int | None = None,
    every: int = 0,
) -> Path:
    """Write one checkpoint atomically and point ``latest`` at it; keep the newest ``keep``.

    With ``every``, an older checkpoint off that schedule (written as a run ended or was
    interrupted) goes too, so a resumed or extended run keeps the checkpoints of a run that
    never stopped.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    remove_partial_writes(root)
    name = f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "tensors.safetensors"))
        (tmp / "state.json").write_text(json.dumps(state))
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_atomic(root / LATEST, name)
    kept = []
    for old in sorted(p for p in root.glob("step-*") if p.is_dir()):
        if every and old != final and int(old.name.removeprefix("step-")) % every:
            shutil.rmtree(old)
        else:
            kept.append(old)
    for old in kept[:-keep] if keep is not None else ():
        shutil.rmtree(old)
    return final


def latest_checkpoint(directory: str | os.PathLike) -> Path:
    """The newest complete checkpoint in ``directory`` (FileNotFoundError if there is none)."""
    root = Path(directory)
    pointer = root / LATEST
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if (candidate / "state.json").is_file():
            return candidate
    found = sorted(p for p in root.glob("step-*") if (p / "state.json").is_file())
    if not found:
        raise FileNotFoundError(f"no checkpoint found in {root}")
    return found[-1]


def load_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and JSON state of one checkpoint folder (or the newest one in a directory)."""
    path = Path(path)
    if not (path / "state.json").is_file():
        path = latest_checkpoint(path)
    return load_file(str(path / "tensors.safetensors")), json.loads(
        (path / "state.json").read_text()
    )


def append_history(directory: str | os.PathLike, records: list[dict[str, Any]]) -> None:
    """Append metrics records to ``DIR/history.jsonl`` (durably) for the checkpoints to cite.

    A checkpoint stores only how many records it covers, so checkpoint cost does not grow
    with the length of the run.
    """
    path = Path(directory) / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.writelines(json.dumps(record) + "\n" for record in records)
        handle.flush()
        os.fsync(handle.fileno())


def read_history(directory: str | os.PathLike, length: int) -> list[dict[str, Any]]:
    """The first ``length`` records of ``DIR/history.jsonl``; later ones are dropped from it."""
    path = Path(directory) / HISTORY
    lines = path.read_text().splitlines() if path.is_file() else []
    if len(lines) < length:
        raise FileNotFoundError(f"{path} holds {len(lines)} records, the checkpoint needs {length}")
    _write_atomic(path, "".join(line + "\n" for line in lines[:length]))
    return [json.loads(line) for line in lines[:length]]
