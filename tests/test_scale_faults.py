"""A pool survives its actors: one killed while scoring or while applying an update is replaced,
and the run ends bit-identical to an unfaulted one; a slow actor takes fewer members.

Faults are planted in the replicas: at a chosen step, the first actor to remove a flag file
SIGKILLs its own process (as the OOM killer would), either halfway through its chunk of members
or before it applies the update. One Ray session (2 CPUs) serves the module.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import time
from dataclasses import dataclass

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import esbox  # noqa: E402
from esbox.adapters.functions import get_function  # noqa: E402
from esbox.adapters.scale import PoolError, RayPool, VectorReplica, state_checksum  # noqa: E402
from esbox.evaluation import FunctionEvaluator  # noqa: E402
from esbox.runner import Budget, Runner  # noqa: E402
from esbox.space import VectorSpace  # noqa: E402
from esbox.specs import Update  # noqa: E402

SPHERE = get_function("sphere")
X0 = np.linspace(-1.0, 1.0, 12)
OPTIONS = {"population": 8, "sigma": 0.1, "learning_rate": 0.05, "optimizer": "adam"}
STEPS, FAULT_STEP = 4, 2
HALF_CPU = {"num_cpus": 0.5}


def objective(x: np.ndarray) -> float:
    """Sphere plus a tiny hash of x's bits: a replica off by one ulp scores differently."""
    bits = int.from_bytes(hashlib.sha256(x.tobytes()).digest()[:4], "little") / 2**32
    return SPHERE(x) + 1e-6 * bits


def claim(flag: str, permanent: bool) -> bool:
    """True for the one process that removes ``flag`` (every process while it exists, when
    ``permanent``)."""
    if permanent:
        return os.path.exists(flag)
    try:
        os.unlink(flag)
    except FileNotFoundError:
        return False
    return True


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class FaultyEvaluator(FunctionEvaluator):
    def __init__(self, fault: Faulty) -> None:
        super().__init__(objective)
        self.fault = fault

    def evaluate(self, space, perturbations):
        fault = self.fault
        if perturbations[0].step == fault.step and fault.armed("evaluate"):
            half = max(len(perturbations) // 2, 1)
            super().evaluate(space, perturbations[:half])  # some members done, then the end
            die()
        return super().evaluate(space, perturbations)


class FaultySpace(VectorSpace):
    fault: Faulty

    def apply(self, update: Update) -> float:
        if update.step == self.fault.step and self.fault.armed("apply"):
            die()  # the other replicas apply it, this one never does
        return super().apply(update)


@dataclass(frozen=True)
class Faulty:
    """A replica factory planting a fault at ``step`` ``during`` "evaluate" or "apply"; never in
    the driver (``driver_pid``)."""

    flag: str
    during: str
    step: int = FAULT_STEP
    permanent: bool = False
    driver_pid: int = os.getpid()

    def armed(self, during: str) -> bool:
        return (
            during == self.during
            and os.getpid() != self.driver_pid
            and claim(self.flag, self.permanent)
        )

    def __call__(self):
        space = FaultySpace(X0)
        space.fault = self
        return space, FaultyEvaluator(self)


@dataclass(frozen=True)
class Uneven:
    """A replica factory whose first actor (the one that removes ``flag``) scores slowly."""

    flag: str
    slow: float
    fast: float

    def __call__(self):
        delay = self.slow if claim(self.flag, permanent=False) else self.fast

        def sleepy(x: np.ndarray) -> float:
            time.sleep(delay)
            return objective(x)

        return VectorSpace(X0), FunctionEvaluator(sleepy)


class Holder:
    """An actor that only holds resources."""

    def ready(self) -> bool:
        return True


def run(space, evaluator, steps: int = STEPS, **runner_options) -> Runner:
    es = esbox.make_strategy("openai_es", space, seed=5, **OPTIONS)
    runner = Runner(space, es, evaluator, Budget(max_steps=steps), **runner_options)
    runner.run()
    return runner


def history(runner: Runner) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "wall_seconds"} for m in runner.history]


@pytest.fixture(scope="module")
def reference() -> tuple[Runner, VectorSpace, FunctionEvaluator]:
    """The unfaulted run, in one process."""
    space, evaluator = VectorReplica(objective, X0)()
    return run(space, evaluator), space, evaluator


def same_run(pooled: Runner, pool: RayPool, reference) -> None:
    single, space, evaluator = reference
    assert history(pooled) == history(single)
    assert pool.checksums() == [state_checksum(space)] * pool.num_actors
    assert pool.best_value == evaluator.best_value
    assert np.array_equal(pool.best_x, evaluator.best_x)


@pytest.mark.parametrize(
    ("during", "local", "replay_limit", "method"),
    [
        ("evaluate", True, 50, r"replay of 2 update\(s\) on the factory's state"),
        ("apply", False, 50, r"replay of 3 update\(s\)"),  # the update being broadcast too
        ("evaluate", True, 0, "copy of the driver's replica"),
        ("apply", False, 0, r"copy of actor [01]'s replica"),
    ],
)
def test_a_killed_actor_is_replaced_and_the_run_is_unchanged(
    ray_session, reference, tmp_path, during, local, replay_limit, method
) -> None:
    flag = tmp_path / "fault"
    flag.touch()
    factory = Faulty(str(flag), during)
    options = {"actor_options": HALF_CPU, "local_replica": local, "replay_limit": replay_limit}
    with RayPool(factory, 2, **options) as pool:
        pooled = run(pool.space, pool)
        assert not flag.exists()  # the fault did fire
        (replaced,) = pool.replacements
        assert replaced.step == FAULT_STEP and during[:5] in replaced.during
        assert pytest.approx(0) != replaced.seconds and replaced.received_bytes > 0
        assert re.match(method, replaced.method)
        same_run(pooled, pool, reference)
        assert pool.verify()


def test_when_retries_run_out_the_error_names_the_actor_and_the_step_and_resume_works(
    ray_session, reference, tmp_path
) -> None:
    flag = tmp_path / "fault"
    flag.touch()
    factory = Faulty(str(flag), "evaluate", permanent=True)  # every attempt at step 2 dies
    with RayPool(factory, 2, actor_options=HALF_CPU, retries=1) as pool:
        died = rf"actor [01] of 2 \(pid .*\) died while evaluating members? .* of step {FAULT_STEP}"
        with pytest.raises(PoolError, match=rf"{died}.*\(retries=1\); the last checkpoint"):
            run(pool.space, pool, checkpoint_dir=tmp_path / "run", checkpoint_every=1)
        flag.unlink()  # the cause is gone: resume from the last checkpoint (step 2)
        es = esbox.make_strategy("openai_es", pool.space, seed=5, **OPTIONS)
        resumed = pool.runner(es, Budget(max_steps=STEPS), checkpoint_dir=tmp_path / "run")
        resumed.resume(tmp_path / "run")
        assert resumed.strategy.step == FAULT_STEP
        resumed.run()
        same_run(resumed, pool, reference)


def test_a_replacement_that_finds_no_room_stops_the_step_naming_the_resources(
    ray_session,
) -> None:
    replica = VectorReplica(objective, X0)
    with RayPool(replica, 2, actor_options=HALF_CPU, local_replica=False) as pool:
        pool.start_timeout = 3  # for the replacement
        os.kill(ray.get(pool.actors[1].describe.remote())["pid"], signal.SIGKILL)
        holder = ray.remote(num_cpus=1.5)(Holder).remote()  # takes what the dead actor freed
        try:
            assert ray.get(holder.ready.remote(), timeout=60)
            es = esbox.make_strategy("openai_es", pool.space, seed=5, **OPTIONS)
            waited = r"actor 1 of 2 \(pid .*\) was not ready within 3 s of being replaced in step 0"
            asks = r"\(it asks for .*num_cpus.*; free: .*\); the last checkpoint is intact"
            with pytest.raises(PoolError, match=rf"{waited} {asks}"):
                pool.evaluate(pool.space, es.ask())
        finally:
            ray.kill(holder)


def test_a_slow_actor_takes_fewer_members_and_the_result_is_unchanged(
    ray_session, reference, tmp_path
) -> None:
    flag = tmp_path / "slow"
    flag.touch()
    slow, fast = 0.25, 0.01
    uneven = Uneven(str(flag), slow, fast)  # no driver replica: it would take the flag
    with RayPool(uneven, 2, actor_options=HALF_CPU, local_replica=False) as pool:
        es = esbox.make_strategy("openai_es", pool.space, seed=5, **OPTIONS)
        pooled = pool.runner(es, Budget(max_steps=STEPS))
        times, counts = [], []
        for _ in range(STEPS):
            start = time.perf_counter()
            pooled.step()
            times.append(time.perf_counter() - start)
            counts.append(np.bincount(pool.last_assignment, minlength=2))
        same_run(pooled, pool, reference)
    slow_actor = int(np.argmin(sum(counts)))
    for count in counts:  # 8 members: the fast actor scores ~25 in the time of one slow one
        assert count[slow_actor] <= 2 and count[1 - slow_actor] >= 6
    # an even split would take 4 slow members (1 s); a straggler costs at most one member
    assert max(times) < 2 * slow
