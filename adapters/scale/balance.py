"""How a step's members are dealt to the replicas: one small chunk at a time to whichever
replica is free, sized by that replica's measured speed, so a slow replica takes fewer members
and never holds the step up by more than one chunk (one member, when members are slow)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from esbox.specs import Perturbation

CHUNK_SECONDS = 0.1
"""A chunk holds as many members as its replica scores in about this time (at least one unit):
cheap members travel in batches, slow ones one at a time."""


def work_units(perturbations: Sequence[Perturbation], keep_twins: bool) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` units covering the population in order: one member each, or,
    when ``keep_twins``, a member together with the antithetic twin that follows it (a replica
    that reflects twins then realises each one exactly as one process would)."""
    units: list[tuple[int, int]] = []
    for i, p in enumerate(perturbations):
        if keep_twins and units and units[-1] == (i - 1, i) and p.mirrors(perturbations[i - 1]):
            units[-1] = (i - 1, i + 1)
        else:
            units.append((i, i + 1))
    return units


def chunk_length(
    pending: Sequence[tuple[int, int]],
    seconds_per_member: float | None,
    workers: int,
    target_seconds: float = CHUNK_SECONDS,
) -> int:
    """How many of the ``pending`` units (in order) the next chunk of a free replica takes.

    One until the replica's speed is measured; then as many as it scores in about
    ``target_seconds``, but never more members than an equal share of half of what is left
    (the tail of a step stays balanced), and always at least one.
    """
    if not pending:
        return 0
    if seconds_per_member is None:
        return 1
    remaining = sum(hi - lo for lo, hi in pending)
    cap = math.ceil(remaining / (2 * max(workers, 1)))
    budget = target_seconds / max(seconds_per_member, 1e-9)
    taken = members = 0
    for lo, hi in pending:
        size = hi - lo
        if taken and (members + size > cap or members + size > budget):
            break
        taken, members = taken + 1, members + size
    return taken


def measured(previous: float | None, seconds: float, members: int) -> float:
    """The replica's seconds per member after a chunk of ``members`` took ``seconds``: an even
    mix of the new measurement and the previous estimate (the first measurement as is)."""
    current = seconds / max(members, 1)
    return current if previous is None else 0.5 * (previous + current)
