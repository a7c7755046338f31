"""Perturbation and update specs: seeds and scalars, so they cross the wire for free.

Optimizers that propose points rather than seeds (nevergrad) carry their points explicitly:
``Perturbation.values`` and ``Update.shift`` hold d floats each. That is the one way a point
can travel to a replica that does not run the optimizer, so those strategies refuse large
spaces (see ``esbox.strategies.nevergrad``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Perturbation:
    """One population member: noise regenerated from seeds, scaled by a signed ``scale``.

    The realised perturbation is ``scale * mask_k * eps`` where ``eps`` is regenerated from
    ``(run_seed, step, seed, tensor, chunk)`` and ``mask_k`` selects subspace ``subspace`` of
    the ``num_subspaces``-way random partition of step ``step`` (no mask when
    ``num_subspaces == 1``). A ``diagonal`` member's noise is also scaled per coordinate by
    the space's scales s (``scale * s * mask_k * eps``: SNES's diagonal sigma). With
    ``rank = r > 0`` the noise of each weight matrix is low-rank, ``A B^T / sqrt(r)``
    (``esbox.lowrank``; realised by model spaces, vectors stay frozen).
    """

    run_seed: int
    step: int
    seed: int
    scale: float
    subspace: int = 0
    num_subspaces: int = 1
    context: int | None = None
    values: tuple[float, ...] | None = None
    diagonal: bool = False
    rank: int = 0

    def __post_init__(self) -> None:
        _tuple_of_floats(self, "values")

    @property
    def sign(self) -> float:
        """+1 or -1: the antithetic side of this member."""
        return 1.0 if self.scale >= 0 else -1.0

    def mirrors(self, other: Perturbation) -> bool:
        """True when this member is ``other``'s antithetic twin: its noise, the opposite scale."""
        explicit = self.values is not None or other.values is not None
        return (
            not explicit
            and self.scale == -other.scale
            and (
                self.run_seed,
                self.step,
                self.seed,
                self.subspace,
                self.num_subspaces,
                self.rank,
            )
            == (
                other.run_seed,
                other.step,
                other.seed,
                other.subspace,
                other.num_subspaces,
                other.rank,
            )
        )

    def to_dict(self) -> dict[str, Any]:
        data = _without_none(asdict(self), "values")
        if not self.diagonal:  # seed specs keep their wire format
            del data["diagonal"]
        if not self.rank:
            del data["rank"]
        return data


@dataclass(frozen=True)
class Term:
    """One noise direction of an update: ``coefficient * mask_k * eps(seed)``."""

    seed: int
    coefficient: float
    subspace: int = 0
    num_subspaces: int = 1


@dataclass(frozen=True)
class OptimizerSpec:
    """Which optimizer turns the estimated gradient into a step, and its hyper-parameters."""

    name: str = "sgd"
    momentum: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0


@dataclass(frozen=True)
class Update:
    """An ascent step ``theta <- opt(theta, sum_j coefficient_j mask_j eps_j, learning_rate)``.

    Applying the same sequence of updates on any replica gives bit-identical parameters
    (same layout and device type), because only seeds and scalars are carried. An explicit
    update carries its step instead: ``theta <- theta + shift`` (no terms; the learning rate
    and optimizer are not used). A ``diagonal`` update scales its direction per coordinate by
    the space's scales s, then moves them: ``s <- s exp(sum_j c_j (eps_j^2 - 1))`` over its
    ``scale_terms`` (SNES). A ``rank > 0`` update replays low-rank noise (``esbox.lowrank``).
    A ``restart`` (``esbox.restarts``) moves to the point its ``shift`` holds,
    ``theta <- shift``, and resets the space's optimizer state and per-coordinate scales.
    """

    run_seed: int
    step: int
    terms: tuple[Term, ...]
    learning_rate: float
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    shift: tuple[float, ...] | None = None
    diagonal: bool = False
    scale_terms: tuple[Term, ...] = ()
    rank: int = 0
    restart: bool = False

    def __post_init__(self) -> None:
        _tuple_of_floats(self, "shift")
        if self.shift is not None and self.terms:
            raise ValueError("an update carries noise terms or an explicit shift, not both")
        if self.restart and self.shift is None:
            raise ValueError("a restart update carries its start point as its shift")

    def to_dict(self) -> dict[str, Any]:
        data = _without_none(asdict(self), "shift")
        if not self.diagonal and not self.scale_terms:  # seed specs keep their wire format
            del data["diagonal"], data["scale_terms"]
        if not self.rank:
            del data["rank"]
        if not self.restart:
            del data["restart"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Update:
        return cls(
            run_seed=data["run_seed"],
            step=data["step"],
            terms=tuple(Term(**t) for t in data["terms"]),
            learning_rate=data["learning_rate"],
            optimizer=OptimizerSpec(**data["optimizer"]),
            shift=data.get("shift"),
            diagonal=data.get("diagonal", False),
            scale_terms=tuple(Term(**t) for t in data.get("scale_terms", ())),
            rank=data.get("rank", 0),
            restart=data.get("restart", False),
        )

    def subspace_groups(self) -> list[list[Term]]:
        """The terms grouped by ``(num_subspaces, subspace)`` in first-seen order, order kept
        within a group: a space masks each group's sum once (subspaces are disjoint)."""
        groups: dict[tuple[int, int], list[Term]] = {}
        for term in self.terms:
            key = (term.num_subspaces, term.subspace if term.num_subspaces > 1 else 0)
            groups.setdefault(key, []).append(term)
        return list(groups.values())


def _tuple_of_floats(spec: Any, name: str) -> None:
    """Store an explicit vector (a list after JSON) as a tuple of floats, so specs compare."""
    value = getattr(spec, name)
    if value is not None and not isinstance(value, tuple):
        object.__setattr__(spec, name, tuple(float(v) for v in value))


def _without_none(data: dict[str, Any], key: str) -> dict[str, Any]:
    """Drop an unset explicit vector: seed specs keep their wire format."""
    if data[key] is None:
        del data[key]
    return data
