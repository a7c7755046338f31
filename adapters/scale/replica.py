"""One replica of a pool, inside its Ray actor: a space and an evaluator built by a factory,
driven by specs; and the picklable factory of a vector replica."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esbox.evaluation import FunctionEvaluator
from esbox.space import DEFAULT_CHUNK_SIZE, ParameterSpace, VectorSpace
from esbox.specs import Perturbation, Update

from .errors import require_ray

Replica = Any
"""What a factory returns: a ``(space, evaluator)`` pair, or an object with ``space`` and
``evaluator`` attributes (e.g. a run config's ``Problem``, whose ``label`` and ``save`` the
pool can then use)."""


SPACE_METHODS = ("sweep", "apply", "state_dict", "load_state_dict")
"""What a replica's space must offer besides ``dimension``: a ``ParameterSpace`` does, and so
does a space over weights that live elsewhere (``VLLMSpace``, inside a vLLM engine)."""


def replica_parts(replica: Replica) -> tuple[ParameterSpace, Any]:
    """The ``(space, evaluator)`` of a replica, whichever form the factory gave."""
    if isinstance(replica, tuple):
        space, evaluator = replica
    else:
        space, evaluator = replica.space, replica.evaluator
    missing = [m for m in SPACE_METHODS if not callable(getattr(space, m, None))]
    if missing or not isinstance(getattr(space, "dimension", None), int):
        raise TypeError(
            f"the factory must return (space, evaluator), got a space {space!r} without "
            f"{', '.join(missing) or 'an int dimension'}"
        )
    return space, evaluator


class _Sizer(pickle.Pickler):
    """Pickles to count bytes: a tensor counts as its data, without a copy being made."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.data = 0

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            self.data += obj.numel() * obj.element_size()
            return tuple, ()
        return NotImplemented


def payload_bytes(value: Any) -> int:
    """Bytes ``value`` takes as the argument or the result of a remote call: its pickle, each
    tensor counted as its data (a Ray object ref counts as the ref, not as its object); what
    only Ray's cloudpickle can pickle (a lambda) is measured by it."""
    buffer = io.BytesIO()
    sizer = _Sizer(buffer)
    try:
        sizer.dump(value)
    except (pickle.PicklingError, TypeError, AttributeError):
        return len(require_ray().cloudpickle.dumps(value))
    return buffer.tell() + sizer.data


@dataclass(frozen=True, eq=False)
class VectorReplica:
    """A picklable factory of one ``VectorSpace`` + ``FunctionEvaluator`` replica of ``fn``.

    ``fn`` must pickle (a module-level function or a ``BenchmarkFunction``); the options
    mean what they mean for ``esbox.optimize``.
    """

    fn: Callable[[np.ndarray], Any]
    x0: Any
    minimize: bool = True
    batched: bool = False
    batch_size: int = 64
    dtype: str = "float64"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    reflect_antithetic: bool = False

    def __call__(self) -> Replica:
        space = VectorSpace(self.x0, dtype=self.dtype, chunk_size=self.chunk_size)
        space.reflect_antithetic = self.reflect_antithetic
        evaluator = FunctionEvaluator(
            self.fn, minimize=self.minimize, batched=self.batched, batch_size=self.batch_size
        )
        return space, evaluator


def state_checksum(space: Any) -> str:
    """SHA-256 of a space's whole state (parameters, fp32 masters, optimizer state)."""
    digest = hashlib.sha256()
    for key, tensor in sorted(space.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{key}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def best_value(evaluator: Any) -> float | None:
    value = getattr(evaluator, "best_value", None)
    return None if value is None else float(value)


class ReplicaActor:
    """One replica inside a Ray actor: built from the factory, driven by specs."""

    def __init__(self, factory: Callable[[], Replica]) -> None:
        self.replica = factory()
        self.space, self.evaluator = replica_parts(self.replica)

    def describe(self) -> dict[str, Any]:
        import ray

        return {
            "dimension": self.space.dimension,
            "best_value": best_value(self.evaluator),
            "where": f"pid {os.getpid()} on {socket.gethostname()}",
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
            "reflects": bool(getattr(self.space, "reflect_antithetic", False)),
            "stateful": hasattr(self.evaluator, "state_dict"),
            "label": getattr(self.replica, "label", None),
        }

    def catch_up(
        self,
        state: dict[str, torch.Tensor] | None,
        updates: list[dict[str, Any]],
        evaluator_state: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """Reach the pool's current parameters: load ``state`` (None: keep the factory's), then
        replay ``updates`` in order; take the pool's best so far. Returns ``describe()`` with
        the bytes received, the seconds it took and the norm of the last update replayed."""
        start = time.perf_counter()
        if state is not None:
            self.space.load_state_dict(state)
        norm = None
        for update in updates:
            norm = self.space.apply(Update.from_dict(update))
        if evaluator_state is not None:
            self.load_evaluator_state(evaluator_state)
        received = {
            "state": payload_bytes(state) if state is not None else 0,
            "updates": payload_bytes(updates),
            "evaluator": payload_bytes(evaluator_state) if evaluator_state else 0,
        }
        seconds = time.perf_counter() - start
        return {**self.describe(), "received": received, "seconds": seconds, "norm": norm}

    def evaluate(self, members: list[dict[str, Any]]) -> tuple[np.ndarray, float | None]:
        perturbations = [Perturbation(**m) for m in members]
        rewards = self.evaluator.evaluate(self.space, perturbations)
        return np.asarray(rewards, dtype=np.float64).reshape(-1), best_value(self.evaluator)

    def apply(self, update: dict[str, Any]) -> float:
        return self.space.apply(Update.from_dict(update))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.space.state_dict()

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self.space.load_state_dict(tensors)

    def checksum(self) -> str:
        return state_checksum(self.space)

    def evaluator_state(self) -> dict[str, Any] | None:
        has = hasattr(self.evaluator, "state_dict")
        return dict(self.evaluator.state_dict()) if has else None

    def load_evaluator_state(self, state: dict[str, Any]) -> float | None:
        if hasattr(self.evaluator, "load_state_dict"):
            self.evaluator.load_state_dict(state)
        return best_value(self.evaluator)

    def evaluator_attribute(self, name: str) -> Any:
        return getattr(self.evaluator, name, None)

    def save(self, directory: str, evaluator_state: dict[str, Any] | None) -> dict[str, Any]:
        """Write the result as the factory's ``save(directory)`` does (e.g. a run's best point
        or trained model), after taking the pool's best so far."""
        save = getattr(self.replica, "save", None)
        if save is None:
            raise TypeError("this replica has no save(directory): its factory returned a pair")
        if evaluator_state is not None:
            self.load_evaluator_state(evaluator_state)
        return dict(save(Path(directory)))
