"""Scale out on Ray: a pool of replicas (space + evaluator per actor) driven by specs alone.

Each actor builds its own replica from a picklable factory. The driver sends a step's
perturbation specs in contiguous blocks (an antithetic twin stays with its partner), gathers
the rewards in order, and broadcasts every ``Update``, which each replica applies by replay:
only seeds and scalars cross the wire, and the replicas stay bit-identical (same layout and
device type). Recipes, including one GPU per LLM replica, are in docs/scale-out.md.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from esbox.runner import Budget, Runner
from esbox.space import ParameterSpace
from esbox.specs import Perturbation, Update
from esbox.strategy import Strategy

from .replica import Replica, ReplicaActor, state_checksum

RAY_EXTRA_HINT = "install the Ray extra: pip install 'esbox[ray]'"
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the tracebacks it forwards


class PoolError(RuntimeError):
    """An actor of a pool failed, died or drifted; the message names it."""


def require_ray() -> Any:
    """Import ray, or say which extra installs it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"esbox's Ray pool needs ray; {RAY_EXTRA_HINT}") from exc
    return ray


def _twin(p: Perturbation, q: Perturbation) -> bool:
    """True when ``p`` is the antithetic twin of ``q`` (same noise, opposite scale)."""
    same = ("run_seed", "step", "seed", "subspace", "num_subspaces")
    return p.scale == -q.scale and all(getattr(p, f) == getattr(q, f) for f in same)


def split_members(perturbations: Sequence[Perturbation], parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[lo, hi)`` blocks of about equal size covering the population,
    never separating an antithetic twin from the partner it follows (a replica can then
    reflect it, and every replica realises exactly what one process would). Blocks may be
    empty when there are fewer members than parts."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    n = len(perturbations)
    starts: list[int] = []  # where each member or (member, twin) group starts
    for i, p in enumerate(perturbations):
        if not (starts and starts[-1] == i - 1 and _twin(p, perturbations[i - 1])):
            starts.append(i)
    bounds = [0]
    for j in range(1, parts):
        ideal = j * n / parts
        candidates = [s for s in (*starts, n) if s >= bounds[-1]]
        bounds.append(min(candidates, key=lambda s: abs(s - ideal)))
    bounds.append(n)
    return list(itertools.pairwise(bounds))


class PoolSpace:
    """The driver's handle on the pool's parameters, to pass to the ``Runner`` as its space.

    ``apply`` and ``load_state_dict`` reach every replica (and the driver's own, when kept);
    ``state_dict`` reads the driver's replica, or actor 0's without one. Anything else (e.g.
    ``vector``) is read from the driver's replica.
    """

    def __init__(self, pool: RayPool) -> None:
        self._pool = pool

    @property
    def dimension(self) -> int:
        return self._pool.dimension

    def apply(self, update: Update) -> float:
        return self._pool._apply(update)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._pool._state_dict()

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self._pool._load_state_dict(tensors)

    def __getattr__(self, name: str) -> Any:
        local = None if name.startswith("_") else self._pool.local
        if local is None:
            raise AttributeError(f"PoolSpace has no {name!r} (and no driver replica to ask)")
        return getattr(local, name)


class RayPool:
    """``num_actors`` Ray actors, each a replica built by ``factory()``; an ``Evaluator``.

    Use ``pool.space`` as the run's space and the pool as its evaluator (``pool.runner``
    wires both). ``actor_options`` go to ``ray.remote`` (default ``{"num_cpus": 1}``; an LLM
    replica takes ``{"num_gpus": 1}``). ``local_replica=True`` also builds a replica on the
    driver that follows every update, so checkpoints are read locally; turn it off when the
    driver cannot hold one or its device type differs from the actors' (replay is
    bit-identical only on the same device type): checkpoints then come from actor 0.
    Ray is initialised with its defaults if nobody did it first.
    """

    def __init__(
        self,
        factory: Callable[[], Replica],
        num_actors: int,
        *,
        actor_options: dict[str, Any] | None = None,
        local_replica: bool = True,
        start_timeout: float | None = 600.0,
    ) -> None:
        if num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {num_actors}")
        self._ray = ray = require_ray()
        options = {"num_cpus": 1, **(actor_options or {})}
        remote = ray.remote(ReplicaActor).options(**options)
        self.actors: list[Any] = [remote.remote(factory) for _ in range(num_actors)]
        self._where = [f"actor {i} of {num_actors}" for i in range(num_actors)]
        self._broken: str | None = None
        self.space = PoolSpace(self)
        try:  # the driver's replica is built while the actors start
            self.local: ParameterSpace | None = factory()[0] if local_replica else None
            infos = self._gather(self._all("describe"), f"starting ({options})", start_timeout)
            self.dimension = int(infos[0]["dimension"])
            if self.local is not None and self.local.dimension != self.dimension:
                raise PoolError(
                    f"the driver's replica has {self.local.dimension} parameters, "
                    f"the actors' have {self.dimension}"
                )
        except BaseException:
            self.close()
            raise
        self._where = [f"{w} ({info['where']})" for w, info in zip(self._where, infos, strict=True)]
        self.best_value: float | None = infos[0]["best_value"]
        self._best_reward = -np.inf
        self._best_actor: int | None = None

    # -- plumbing ----------------------------------------------------------------------------------
    def _all(self, method: str, *args: Any) -> list[tuple[int, Any]]:
        """``(actor index, result ref)`` of calling ``method(*args)`` on every actor."""
        return [(i, getattr(a, method).remote(*args)) for i, a in enumerate(self.actors)]

    def _gather(
        self,
        calls: Sequence[tuple[int, Any]],
        doing: str | Callable[[int], str],
        timeout: float | None = None,
    ) -> list[Any]:
        """The results of ``(actor index, ref)`` calls, in order. Waits for every call before
        raising the first failure as a ``PoolError`` naming its actor, so no actor is left
        in the middle of one. ``doing`` says what the k-th call was doing."""
        errors = self._ray.exceptions
        results: list[Any] = []
        failure: tuple[str, BaseException] | None = None
        for k, (i, ref) in enumerate(calls):
            what = doing(k) if callable(doing) else doing
            result = None
            try:
                result = self._ray.get(ref, timeout=timeout)
            except errors.RayActorError as exc:
                failure = failure or (f"{self._where[i]} died while {what}: {exc}", exc)
            except errors.GetTimeoutError as exc:
                message = (
                    f"{self._where[i]} did not finish {what} within {timeout} s "
                    f"(free resources: {self._ray.available_resources()})"
                )
                failure = failure or (message, exc)
            except errors.RayTaskError as exc:
                cause = getattr(exc, "cause", None) or exc
                message = f"{self._where[i]} failed while {what}: {type(cause).__name__}: {cause}"
                failure = failure or (message, exc)
            except errors.RayError as exc:  # lost objects, crashed workers, ...
                failure = failure or (f"{self._where[i]} failed while {what}: {exc}", exc)
            results.append(result)
        if failure is not None:
            raise PoolError(ANSI_COLOUR.sub("", failure[0])) from failure[1]
        return results

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise PoolError(f"the pool is unusable: {self._broken}")

    @property
    def num_actors(self) -> int:
        return len(self.actors)

    # -- the Evaluator ---------------------------------------------------------------------------
    def evaluate(self, space: Any, perturbations: Sequence[Perturbation]) -> np.ndarray:
        """Rewards of the population, in order, each block of members scored by one actor."""
        if space is not self.space:
            raise TypeError("a RayPool scores its own replicas: give the run pool.space")
        self._check_usable()
        plan = [
            (i, lo, hi)
            for i, (lo, hi) in enumerate(split_members(perturbations, self.num_actors))
            if hi > lo
        ]
        calls = [
            (i, self.actors[i].evaluate.remote([p.to_dict() for p in perturbations[lo:hi]]))
            for i, lo, hi in plan
        ]
        step = perturbations[0].step if perturbations else "?"

        def doing(k: int) -> str:
            _, lo, hi = plan[k]
            return f"evaluating members {lo}..{hi - 1} of step {step}"

        rewards = np.empty(len(perturbations))
        for (i, lo, hi), (block, best) in zip(plan, self._gather(calls, doing), strict=True):
            if block.size != hi - lo:
                raise PoolError(f"{self._where[i]} returned {block.size} rewards for {hi - lo}")
            rewards[lo:hi] = block
            finite = block[np.isfinite(block)]
            # the first best in member order, as one evaluator scoring them all would keep
            if finite.size and finite.max() > self._best_reward:
                self._best_reward, self._best_actor, self.best_value = finite.max(), i, best
        return rewards

    @property
    def best_x(self) -> Any:
        """The evaluator's ``best_x`` from the replica that found the best reward (or None)."""
        actor = self.actors[self._best_actor or 0]
        return self._ray.get(actor.evaluator_attribute.remote("best_x"))

    def state_dict(self) -> dict[str, Any]:
        """The evaluator state of the replica with the best reward, plus that reward: the same
        shape as one evaluator's state, so pooled and one-process checkpoints interchange."""
        self._check_usable()
        i = self._best_actor or 0
        (inner,) = self._gather([(i, self.actors[i].evaluator_state.remote())], "saving")
        return {**(inner or {}), "pool_best_reward": float(self._best_reward)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Give every replica's evaluator the saved state (all then share the best so far)."""
        self._check_usable()
        inner = {k: v for k, v in state.items() if k != "pool_best_reward"}
        if set(inner) - {"tensors"}:
            calls = self._all("load_evaluator_state", self._ray.put(inner))
            self.best_value = self._gather(calls, "loading the evaluator state")[0]
        self._best_reward = float(state.get("pool_best_reward", -np.inf))
        self._best_actor = None

    # -- the space, broadcast ----------------------------------------------------------------------
    def _apply(self, update: Update) -> float:
        self._check_usable()
        calls = self._all("apply", update.to_dict())
        try:  # the driver's replica applies it while the actors do
            norm = self.local.apply(update) if self.local is not None else None
            norms = self._gather(calls, f"applying the update of step {update.step}")
        except BaseException as exc:
            self._broken = f"the update of step {update.step} did not reach every replica ({exc})"
            raise
        return norm if norm is not None else norms[0]

    def _state_dict(self) -> dict[str, torch.Tensor]:
        if self.local is not None:  # the reference copy, readable even when an actor failed
            return self.local.state_dict()
        self._check_usable()
        return self._gather([(0, self.actors[0].state_dict.remote())], "saving")[0]

    def _load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.local is not None:
            self.local.load_state_dict(tensors)
        self._gather(self._all("load_state_dict", self._ray.put(tensors)), "loading parameters")
        self._broken = None  # every replica holds the same state again

    # -- checks and lifetime ---------------------------------------------------------------------
    def checksums(self) -> list[str]:
        """``state_checksum`` of every actor's replica, in order (a pass over the weights)."""
        return self._gather(self._all("checksum"), "hashing its state")

    def verify(self) -> str:
        """Check that every replica (and the driver's) holds the same state; returns its
        checksum, or raises ``PoolError`` naming the first replica that differs."""
        sums = self.checksums()
        if self.local is not None:
            reference, name = state_checksum(self.local), "the driver's replica"
        else:
            reference, name = sums[0], self._where[0]
        for where, checksum in zip(self._where, sums, strict=True):
            if checksum != reference:
                self._broken = f"{where} drifted from {name}"
                raise PoolError(f"{where} holds other parameters than {name}")
        return reference

    def runner(self, strategy: Strategy, budget: Budget, **options: Any) -> Runner:
        """A ``Runner`` over the pool: ``pool.space`` as its space, the pool as its evaluator."""
        return Runner(self.space, strategy, self, budget, **options)

    def close(self) -> None:
        """Kill the actors (the driver's replica stays readable)."""
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
        self._broken = "it was closed"

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
