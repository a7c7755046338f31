"""The actors of a pool, kept alive: each holds a replica built by the factory; one that dies is
replaced by a new actor from the same factory that catches up with the pool's parameters, at
most ``retries`` times a step, and every replacement is recorded with what it cost."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from esbox.space import ParameterSpace

from .errors import PoolError, failure, is_death, require_ray
from .replica import Replica, ReplicaActor, payload_bytes

Call = tuple[int, str, tuple[Any, ...]]  # (actor index, method, arguments)


@dataclass(frozen=True)
class Replacement:
    """A dead actor replaced: which, in which step and doing what; how the new actor caught up
    with the pool, the bytes it received, and the seconds from the death to it being ready."""

    actor: int
    step: int | None
    during: str
    method: str
    received_bytes: int
    seconds: float


@dataclass
class Traffic:
    """What the driver's calls to the actors carried: calls made, bytes of their arguments
    (sent) and of their results (received), as ``payload_bytes`` counts them."""

    calls: int = 0
    sent: int = 0
    received: int = 0


class Actors:
    """``num_actors`` Ray actors (``ReplicaActor``), their names, speeds and replacements.

    What a replacement needs to reach the pool's parameters is kept here: the ``base`` state
    (None: the factory's own; else the ref of the tensors last loaded) and the ``log`` of update
    specs applied since, while there are at most ``replay_limit`` of them; beyond, a
    replacement copies the state of the driver's replica (``local``) or of a live actor.
    """

    def __init__(
        self,
        factory: Callable[[], Replica],
        num_actors: int,
        options: dict[str, Any],
        *,
        retries: int,
        replay_limit: int,
        start_timeout: float | None,
    ) -> None:
        if num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {num_actors}")
        if retries < 0 or replay_limit < 0:
            raise ValueError(
                f"retries and replay_limit must be >= 0, got {retries}, {replay_limit}"
            )
        self.ray = require_ray()
        self.factory, self.options = factory, options
        self.retries, self.replay_limit, self.start_timeout = retries, replay_limit, start_timeout
        self.remote = self.ray.remote(ReplicaActor).options(**options)
        self.handles: list[Any] = [self.remote.remote(factory) for _ in range(num_actors)]
        self.where = [f"actor {i} of {num_actors}" for i in range(num_actors)]
        self.speed: list[float | None] = [None] * num_actors  # seconds per member, measured
        self.base: Any = None
        self.log: list[dict[str, Any]] | None = []
        self.local: ParameterSpace | None = None  # the driver's replica, a source to copy
        self.best_state: dict[str, Any] | None = None  # handed to every replacement
        self.replacing: dict[int, tuple[float, str, str]] = {}
        self.replacements: list[Replacement] = []
        self.traffic = Traffic()
        self.deaths, self.step = 0, None

    def __len__(self) -> int:
        return len(self.handles)

    def start(self) -> list[dict[str, Any]]:
        """``describe()`` of every new actor; the first that failed to start raises, naming it
        and (on a timeout) the resources Ray has free."""
        refs = [self.call(i, "describe") for i in range(len(self))]
        infos, error = [], None
        for i, ref in enumerate(refs):
            try:
                infos.append(self.get(ref, timeout=self.start_timeout))
            except self.ray.exceptions.GetTimeoutError:
                error = error or self.not_placed(i, "of starting")
            except self.ray.exceptions.RayError as exc:
                error = error or self.error(i, f"starting ({self.options})", exc)
        if error is not None:
            raise error
        for i, info in enumerate(infos):
            self.joined(i, info)
        return infos

    def joined(self, i: int, info: dict[str, Any]) -> None:
        self.where[i] = f"actor {i} of {len(self)} ({info['where']})"

    def not_placed(self, i: int, doing: str, *, replacing: bool = False) -> PoolError:
        """A ``PoolError``: actor ``i`` was not ready within ``start_timeout`` seconds ``doing``,
        with what it asks for and what Ray has free (Ray holds an actor until it fits)."""
        free = self.ray.available_resources()
        intact = "; the last checkpoint is intact" if replacing else ""
        return PoolError(
            f"{self.where[i]} was not ready within {self.start_timeout} s {doing} (it asks for "
            f"{self.options}; free: {free}){intact}"
        )

    def error(self, i: int, doing: str, exc: BaseException) -> PoolError:
        """A ``PoolError`` naming actor ``i``, with ``exc`` as its cause."""
        error = failure(self.where[i], doing, exc)
        error.__cause__ = exc
        return error

    def new_step(self, step: int | None) -> None:
        """A step begins: it may replace up to ``retries`` actors."""
        self.deaths, self.step = 0, step

    def record(self, update: dict[str, Any]) -> None:
        """An update every replica applies: a replacement replays it, within ``replay_limit``."""
        if self.log is not None:
            self.log.append(update)
            if len(self.log) > self.replay_limit:
                self.log = None

    def rebase(self, tensors: Any) -> None:
        """Every replica loads ``tensors`` (a ref): replacements start from them, and the pool
        starts afresh (e.g. resuming after a step that ran out of retries)."""
        self.base, self.log = tensors, []
        self.new_step(None)

    # -- replacing dead actors -------------------------------------------------------------------
    def respawn(self, i: int, doing: str, exc: BaseException) -> Any:
        """Actor ``i`` died while ``doing``: start a new one from the factory, catching up with
        the pool; returns the ref that resolves once it is ready. ``PoolError`` when this step
        has already replaced ``retries`` actors."""
        self.deaths += 1
        if self.deaths > self.retries:
            step = "this step" if self.step is None else f"step {self.step}"
            raise PoolError(
                f"{self.where[i]} died while {doing}, and {self.retries} dead actor(s) were "
                f"already replaced in {step}, the most allowed (retries={self.retries}); "
                f"the last checkpoint is intact. Cause: {failure(self.where[i], doing, exc)}"
            ) from exc
        started = time.perf_counter()
        self.ray.kill(self.handles[i], no_restart=True)  # it may linger, e.g. unreachable
        self.handles[i] = self.remote.remote(self.factory)
        self.speed[i] = None
        state, updates, method = self._plan(i)
        self.replacing[i] = (started, doing, method)
        return self.call(i, "catch_up", state, updates, self.best_state)

    def _plan(self, i: int) -> tuple[Any, list[dict[str, Any]], str]:
        """What the new actor ``i`` needs to reach the pool's parameters: the base and the
        update specs since (only seeds and scalars travel, unless the base was loaded), or a
        live replica's state after more than ``replay_limit`` updates."""
        if self.log is not None:
            source = "the factory's state" if self.base is None else "the state last loaded"
            return self.base, self.log, f"replay of {len(self.log)} update(s) on {source}"
        if self.local is not None:
            return self.ray.put(self.local.state_dict()), [], "copy of the driver's replica"
        for j in range(len(self)):
            if j != i and j not in self.replacing:  # the state goes from actor j to actor i
                return self.call(j, "state_dict"), [], f"copy of actor {j}'s replica"
        raise PoolError(
            f"{self.where[i]} cannot be replaced: no live replica to copy the parameters from, "
            f"and more than replay_limit={self.replay_limit} updates to replay; resume the run "
            f"from its last checkpoint"
        )

    def ready(self, i: int, info: dict[str, Any]) -> None:
        """The replacement of actor ``i`` caught up: record what it cost."""
        started, doing, method = self.replacing.pop(i)
        self.joined(i, info)
        seconds = time.perf_counter() - started
        received = sum(info["received"].values())
        self.replacements.append(Replacement(i, self.step, doing, method, received, seconds))

    def wait_ready(self, i: int, ref: Any, doing: str) -> dict[str, Any]:
        """Wait for the replacement of actor ``i`` (started by ``respawn``) to catch up."""
        while True:
            try:
                info = self.get(ref, timeout=self.start_timeout)
            except self.ray.exceptions.GetTimeoutError:
                self.replacing.pop(i, None)
                raise self.not_placed(
                    i, f"of being replaced after {doing}", replacing=True
                ) from None
            except self.ray.exceptions.RayError as exc:
                if not is_death(exc):
                    self.replacing.pop(i, None)
                    raise self.error(i, f"catching up after {doing}", exc) from exc
                ref = self.respawn(i, doing, exc)
                continue
            self.ready(i, info)
            return info

    # -- calls that survive deaths ---------------------------------------------------------------
    def run(self, calls: Sequence[Call], doing: str, *, reissue: bool) -> list[Any]:
        """The results of ``calls``, in order. An actor that died is replaced; with ``reissue``
        its call is made again on the replacement, else its result is the replacement's
        ``catch_up`` norm (for updates, which catching up applies)."""
        pending = {self.call(i, m, *a): (k, i) for k, (i, m, a) in enumerate(calls)}
        return self.settle(pending, calls, doing, reissue=reissue)

    def call(self, i: int, method: str, *args: Any) -> Any:
        """Call ``method`` of actor ``i``; its ref (the arguments are counted as sent)."""
        self.traffic.calls += 1
        self.traffic.sent += payload_bytes(args)
        return getattr(self.handles[i], method).remote(*args)

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        """The result of a call (counted as received); raises what ``ray.get`` raises."""
        result = self.ray.get(ref, timeout=timeout)
        self.traffic.received += payload_bytes(result)
        return result

    def settle(
        self,
        pending: dict[Any, tuple[int, int]],
        calls: Sequence[Call],
        doing: str,
        *,
        reissue: bool,
    ) -> list[Any]:
        """``run`` for calls already made (``pending``: ref -> (call index, actor)). Waits for
        every call before raising the first failure, so no actor is left in the middle of one."""
        results: list[Any] = [None] * len(calls)
        error: PoolError | None = None
        while pending:
            [ref], _ = self.ray.wait(list(pending), num_returns=1)
            k, i = pending.pop(ref)
            try:
                results[k] = self.get(ref)
                continue
            except self.ray.exceptions.RayError as exc:
                if error is not None or not is_death(exc):
                    error = error or self.error(i, doing, exc)
                    continue
                try:
                    info = self.wait_ready(i, self.respawn(i, doing, exc), doing)
                except PoolError as lost:
                    error = lost
                    continue
            if reissue:
                pending[self.call(i, calls[k][1], *calls[k][2])] = (k, i)
            else:
                results[k] = info.get("norm")
        if error is not None:
            raise error
        return results

    def close(self) -> None:
        """Kill every actor."""
        for actor in self.handles:
            self.ray.kill(actor)
        self.handles, self.base = [], None
