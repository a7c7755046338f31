"""What can go wrong in a pool, in words: importing Ray, an actor that dies, a call that fails."""

from __future__ import annotations

import re
from typing import Any

RAY_EXTRA_HINT = "install the Ray extra: pip install 'esbox[ray]'"
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the tracebacks it forwards


class PoolError(RuntimeError):
    """An actor of a pool failed, died for good or drifted; the message names it."""


def require_ray() -> Any:
    """Import ray, or say which extra installs it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"esbox's Ray pool needs ray; {RAY_EXTRA_HINT}") from exc
    return ray


def is_death(exc: BaseException) -> bool:
    """True when ``exc`` says the actor's process is gone (killed, out of memory, node lost),
    rather than that the call raised inside a live actor."""
    errors = require_ray().exceptions
    deaths = (
        errors.RayActorError,
        errors.WorkerCrashedError,
        errors.NodeDiedError,
        errors.OutOfMemoryError,
        errors.ObjectLostError,
        errors.LocalRayletDiedError,
    )
    return isinstance(exc, deaths)


def failure(where: str, doing: str, exc: BaseException) -> PoolError:
    """A ``PoolError`` naming the actor, what it was doing and the cause (the call's own
    exception for an error raised inside the actor)."""
    errors = require_ray().exceptions
    if isinstance(exc, errors.RayTaskError) and not is_death(exc):
        cause = getattr(exc, "cause", None) or exc
        text = f"{where} failed while {doing}: {type(cause).__name__}: {cause}"
    elif is_death(exc):
        text = f"{where} died while {doing}: {exc}"
    else:
        text = f"{where} failed while {doing}: {exc}"
    return PoolError(ANSI_COLOUR.sub("", text))
