"""Scale out on Ray: a pool of replicas (space + evaluator per actor) driven by specs alone.

Each actor builds its own replica from a picklable factory. The driver deals a step's
perturbation specs to whichever actor is free, in chunks sized by its measured speed
(``balance``), puts the rewards back by member index, and broadcasts every ``Update``, which
each replica applies by replay: only seeds and scalars cross the wire, and the replicas stay
bit-identical (same layout and device type). An actor that dies is replaced by a new one from
the factory, brought to the current parameters (``catch_up``), and its unfinished members are
scored again, so the step's rewards and update do not change. Recipes: docs/scale-out.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esbox.runner import Budget, Runner
from esbox.space import ParameterSpace
from esbox.specs import Perturbation, Update
from esbox.strategy import Strategy

from .actors import Actors, Replacement, Traffic
from .balance import chunk_length, measured, work_units
from .errors import PoolError, is_death, require_ray
from .replica import Replica, replica_parts, state_checksum


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

    Use ``pool.space`` as the run's space and the pool as its evaluator (``pool.runner`` wires
    both). ``actor_options`` go to ``ray.remote`` (default ``{"num_cpus": 1}``; an LLM replica
    takes ``{"num_gpus": 1}``). ``local_replica=True`` also builds a replica on the driver that
    follows every update, so checkpoints are read locally (a ``(space, evaluator)`` pair, or a
    ``Problem``, is used as that replica instead); turn it off when the driver cannot hold one or
    its device type differs from the actors' (replay is bit-identical only on the same device
    type): checkpoints then come from actor 0. Up to ``retries`` dead actors a step are replaced;
    a replacement replays the updates since the pool's base state while there are at most
    ``replay_limit`` of them, else copies the parameters of a live replica (``Actors``). Ray is
    initialised with its defaults if nobody did it first.
    """

    def __init__(
        self,
        factory: Callable[[], Replica],
        num_actors: int,
        *,
        actor_options: dict[str, Any] | None = None,
        local_replica: bool | Replica = True,
        start_timeout: float | None = 600.0,
        retries: int = 3,
        replay_limit: int = 50,
    ) -> None:
        self._ray = require_ray()
        options = {"num_cpus": 1, **(actor_options or {})}
        self._actors = actors = Actors(
            factory,
            num_actors,
            options,
            retries=retries,
            replay_limit=replay_limit,
            start_timeout=start_timeout,
        )
        self._broken: str | None = None
        self.space = PoolSpace(self)
        self.last_assignment: list[int] = []  # the actor that scored each member, last step
        self._best_reward, self._best_actor = -np.inf, None
        self.local: ParameterSpace | None = None
        self._local_evaluator: Any = None
        try:  # the driver's replica is built while the actors start
            if local_replica is True:
                local_replica = factory()
            if local_replica is not False and local_replica is not None:
                self.local, self._local_evaluator = replica_parts(local_replica)
            infos = actors.start()
            actors.best_state = actors.get(actors.call(0, "evaluator_state"))
        except BaseException:
            self.close()
            raise
        actors.local = self.local
        self.dimension = int(infos[0]["dimension"])
        if self.local is not None and self.local.dimension != self.dimension:
            self.close()
            raise PoolError(
                f"the driver's replica has {self.local.dimension} parameters, "
                f"the actors' have {self.dimension}"
            )
        self.best_value: float | None = infos[0]["best_value"]
        self.label: str | None = infos[0]["label"]
        self._keep_twins = any(info["reflects"] for info in infos)

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, in order (a replaced actor's handle is the new one)."""
        return self._actors.handles

    @property
    def num_actors(self) -> int:
        return len(self._actors)

    @property
    def replacements(self) -> list[Replacement]:
        """Every dead actor replaced so far, with what its replacement cost."""
        return self._actors.replacements

    @property
    def start_timeout(self) -> float | None:
        """Seconds an actor, new or replacing a dead one, may take to be ready (None: no
        limit); past them a ``PoolError`` names the resources it asks for and those free."""
        return self._actors.start_timeout

    @start_timeout.setter
    def start_timeout(self, value: float | None) -> None:
        self._actors.start_timeout = value

    @property
    def traffic(self) -> Traffic:
        """What the pool's calls carried so far (a copy): subtract two readings for a step."""
        return dataclasses.replace(self._actors.traffic)

    @property
    def retries(self) -> int:
        """Dead actors replaced in one step before a ``PoolError`` stops it."""
        return self._actors.retries

    @retries.setter
    def retries(self, value: int) -> None:
        self._actors.retries = value

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise PoolError(f"the pool is unusable: {self._broken}")

    # -- the Evaluator ---------------------------------------------------------------------------
    def evaluate(self, space: Any, perturbations: Sequence[Perturbation]) -> np.ndarray:
        """Rewards of the population, in member order: each free actor takes the next chunk of
        members; a dead actor's chunk goes back to the front of the queue for the others and
        its replacement."""
        if space is not self.space:
            raise TypeError("a RayPool scores its own replicas: give the run pool.space")
        self._check_usable()
        actors = self._actors
        step = perturbations[0].step if perturbations else None
        actors.new_step(step)
        members = [p.to_dict() for p in perturbations]
        queue = deque(work_units(perturbations, self._keep_twins))
        rewards = np.empty(len(perturbations))
        owner = [-1] * len(perturbations)
        done: list[tuple[int, int, int, np.ndarray, float | None]] = []
        jobs: dict[Any, tuple[str, int, Any]] = {}  # ref -> (kind, actor, chunk or started)
        idle = list(range(self.num_actors))
        error: PoolError | None = None
        while True:
            while error is None and queue and idle:
                i = idle.pop(0)
                chunk = [
                    queue.popleft()
                    for _ in range(chunk_length(queue, actors.speed[i], len(actors)))
                ]
                lo, hi = chunk[0][0], chunk[-1][1]
                ref = actors.call(i, "evaluate", members[lo:hi])
                jobs[ref] = ("score", i, (chunk, time.perf_counter()))
            if not jobs:
                break
            joining = [i for kind, i, _ in jobs.values() if kind == "join"]
            timeout = actors.start_timeout if len(joining) == len(jobs) else None
            ready, _ = self._ray.wait(list(jobs), num_returns=1, timeout=timeout)
            if not ready:  # e.g. its node is gone and no other has room
                raise actors.not_placed(
                    joining[0], f"of being replaced in step {step}", replacing=True
                )
            [ref] = ready
            kind, i, payload = jobs.pop(ref)
            if kind == "join":
                doing = payload
            else:
                chunk, started = payload
                lo, hi = chunk[0][0], chunk[-1][1]
                which = f"member {lo}" if hi - lo == 1 else f"members {lo}..{hi - 1}"
                doing = f"evaluating {which} of step {step}"
            try:
                result = actors.get(ref)
            except self._ray.exceptions.RayError as exc:
                if not is_death(exc):
                    actors.replacing.pop(i, None)
                    error = error or actors.error(i, doing, exc)
                    idle.append(i)
                    continue
                if kind == "score":
                    queue = deque(sorted([*queue, *chunk]))
                try:
                    jobs[actors.respawn(i, doing, exc)] = ("join", i, doing)
                except PoolError as exc2:
                    error = error or exc2
                continue
            if kind == "join":
                actors.ready(i, result)
            else:
                block, best = result
                if block.size != hi - lo:
                    raise PoolError(
                        f"{actors.where[i]} returned {block.size} rewards for {hi - lo}"
                    )
                rewards[lo:hi] = block
                owner[lo:hi] = [i] * (hi - lo)
                done.append((lo, hi, i, block, best))
                actors.speed[i] = measured(actors.speed[i], time.perf_counter() - started, hi - lo)
            idle.append(i)
        if error is not None:
            raise error
        self.last_assignment = owner
        self._track_best(done, members, step)
        return rewards

    def _track_best(
        self, done: list[tuple[int, int, int, np.ndarray, float | None]], members: list, step: Any
    ) -> None:
        """The best reward so far, the first in member order as one evaluator would keep it,
        and (when it improved) the evaluator state of the actor that found it."""
        found = None
        for lo, hi, i, block, best in sorted(done, key=lambda d: d[0]):
            finite = block[np.isfinite(block)]
            if finite.size and finite.max() > self._best_reward:
                self._best_reward, self._best_actor, self.best_value = finite.max(), i, best
                found = (i, members[lo:hi], f"reading the best of step {step}")
        if found is None or self._actors.best_state is None:
            return
        self._actors.best_state = state = self._best_state_of(*found)
        if hasattr(self._local_evaluator, "load_state_dict"):
            self._local_evaluator.load_state_dict(state)

    def _best_state_of(self, i: int, members: list[dict[str, Any]], doing: str) -> Any:
        """Actor ``i``'s evaluator state; if it died since, its replacement scores ``members``
        (the chunk holding the best) again first, and so finds the same best."""
        rescore = False
        while True:
            try:
                if rescore:
                    self._actors.get(self._actors.call(i, "evaluate", members))
                return self._actors.get(self._actors.call(i, "evaluator_state"))
            except self._ray.exceptions.RayError as exc:
                if not is_death(exc):
                    raise self._actors.error(i, doing, exc) from exc
                self._actors.wait_ready(i, self._actors.respawn(i, doing, exc), doing)
                rescore = True

    @property
    def best_x(self) -> Any:
        """The evaluator's ``best_x`` for the best reward so far (or None)."""
        if self._local_evaluator is not None:
            return getattr(self._local_evaluator, "best_x", None)
        i = self._best_actor or 0
        call = (i, "evaluator_attribute", ("best_x",))
        return self._actors.run([call], "reading best_x", reissue=True)[0]

    def state_dict(self) -> dict[str, Any]:
        """The evaluator state of the best so far, plus its reward: the same shape as one
        evaluator's state, so pooled and one-process checkpoints interchange."""
        self._check_usable()
        return {**(self._actors.best_state or {}), "pool_best_reward": float(self._best_reward)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Give every replica's evaluator the saved state (all then share the best so far)."""
        self._check_usable()
        inner = {k: v for k, v in state.items() if k != "pool_best_reward"}
        if set(inner) - {"tensors"}:
            self._actors.best_state = inner
            if hasattr(self._local_evaluator, "load_state_dict"):
                self._local_evaluator.load_state_dict(inner)
            ref = self._ray.put(inner)
            calls = [(i, "load_evaluator_state", (ref,)) for i in range(self.num_actors)]
            self.best_value = self._actors.run(calls, "loading the evaluator state", reissue=True)[
                0
            ]
        self._best_reward = float(state.get("pool_best_reward", -np.inf))
        self._best_actor = None

    # -- the space, broadcast ----------------------------------------------------------------------
    def _apply(self, update: Update) -> float:
        self._check_usable()
        spec = update.to_dict()
        self._actors.record(spec)
        calls = [(i, "apply", (spec,)) for i in range(self.num_actors)]
        doing = f"applying the update of step {update.step}"
        try:  # the driver's replica applies it while the actors do
            pending = {self._actors.call(i, "apply", spec): (i, i) for i in range(self.num_actors)}
            norm = self.local.apply(update) if self.local is not None else None
            norms = self._actors.settle(pending, calls, doing, reissue=False)
        except BaseException as exc:
            self._broken = f"the update of step {update.step} did not reach every replica ({exc})"
            raise
        found = [n for n in norms if n is not None]
        return norm if norm is not None else (found[0] if found else float("nan"))

    def _state_dict(self) -> dict[str, torch.Tensor]:
        if self.local is not None:  # the reference copy, readable even when an actor failed
            return self.local.state_dict()
        self._check_usable()
        return self._actors.run([(0, "state_dict", ())], "reading its parameters", reissue=True)[0]

    def _load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.local is not None:
            self.local.load_state_dict(tensors)
        ref = self._ray.put(tensors)
        self._actors.rebase(ref)  # what a replacement starts from
        calls = [(i, "load_state_dict", (ref,)) for i in range(self.num_actors)]
        self._actors.run(calls, "loading parameters", reissue=False)
        self._broken = None  # every replica holds the same state again

    # -- checks, results and lifetime ------------------------------------------------------------
    def checksums(self) -> list[str]:
        """``state_checksum`` of every actor's replica, in order (a pass over the weights)."""
        calls = [(i, "checksum", ()) for i in range(self.num_actors)]
        return self._actors.run(calls, "hashing its state", reissue=True)

    def verify(self) -> str:
        """Check that every replica (and the driver's) holds the same state; returns its
        checksum, or raises ``PoolError`` naming the first replica that differs."""
        sums = self.checksums()
        if self.local is not None:
            reference, name = state_checksum(self.local), "the driver's replica"
        else:
            reference, name = sums[0], self._actors.where[0]
        for where, checksum in zip(self._actors.where, sums, strict=True):
            if checksum != reference:
                self._broken = f"{where} drifted from {name}"
                raise PoolError(f"{where} holds other parameters than {name}")
        return reference

    def save(self, directory: str | Path) -> dict[str, Any]:
        """The factory's ``save(directory)`` (a run's best point or trained model), run by
        actor 0 with the pool's best so far: for a pool without a driver replica."""
        call = (0, "save", (str(directory), self._actors.best_state))
        return self._actors.run([call], "saving the result", reissue=True)[0]

    def runner(self, strategy: Strategy, budget: Budget, **options: Any) -> Runner:
        """A ``Runner`` over the pool: ``pool.space`` as its space, the pool as its evaluator."""
        return Runner(self.space, strategy, self, budget, **options)

    def close(self) -> None:
        """Kill the actors (the driver's replica stays readable)."""
        self._actors.close()
        self._broken = "it was closed"

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
