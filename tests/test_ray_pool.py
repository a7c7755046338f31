"""The Ray pool: replicas stay bit-identical to one process, failures name their actor, resume.

One Ray session (2 CPUs) serves the module; actors take half a CPU each so two pools fit.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import signal

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import esbox  # noqa: E402
from esbox.adapters.functions import get_function  # noqa: E402
from esbox.adapters.scale import (  # noqa: E402
    PoolError,
    RayPool,
    VectorReplica,
    state_checksum,
    work_units,
)
from esbox.adapters.scale.balance import chunk_length, measured  # noqa: E402
from esbox.runner import Budget, Runner  # noqa: E402
from esbox.specs import Perturbation, Term, Update  # noqa: E402

ROSENBROCK = get_function("rosenbrock")
X0 = ROSENBROCK.default_x0(10, seed=3)
STRATEGY_OPTIONS = {
    # 3 antithetic pairs: half the population would split one (at this sigma a drawn twin is
    # not bit-identical to a reflected one)
    "openai_es": {"population": 6, "sigma": 0.3, "learning_rate": 0.02, "optimizer": "adam"},
    "copes": {"population": 8, "subspaces": 2, "sigma": 0.05, "learning_rate": 0.02},
}
HALF_CPU = {"num_cpus": 0.5}


def fussy(x: np.ndarray) -> float:
    """Rosenbrock plus a tiny hash of x's bits, so a replica off by one ulp scores differently;
    it refuses points far out, so a test can make one actor's block fail."""
    if np.abs(x).max() > 100:
        raise ValueError("x is out of range")
    bits = int.from_bytes(hashlib.sha256(x.tobytes()).digest()[:4], "little") / 2**32
    return ROSENBROCK(x) + 1e-6 * bits


# reflect_antithetic: a twin split from its partner would be drawn, not reflected, and the
# trajectory would then differ from one process's in the last bits
REPLICA = VectorReplica(fussy, X0, reflect_antithetic=True)


@pytest.fixture(scope="module")
def shared_pool(ray_session):
    pool = RayPool(REPLICA, 2, actor_options=HALF_CPU)
    yield pool
    pool.close()


@pytest.fixture
def pool(shared_pool: RayPool) -> RayPool:
    """The module's pool, back at x0 with a fresh evaluator on every replica."""
    shared_pool.space.load_state_dict(REPLICA()[0].state_dict())
    shared_pool.load_state_dict({"best_value": math.inf, "tensors": {}})
    return shared_pool


def run(space, evaluator, strategy: str, steps: int, **runner_options) -> Runner:
    es = esbox.make_strategy(strategy, space, seed=7, **STRATEGY_OPTIONS[strategy])
    runner = Runner(space, es, evaluator, Budget(max_steps=steps), **runner_options)
    runner.run()
    return runner


def history(runner: Runner) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "wall_seconds"} for m in runner.history]


def members(population: int, antithetic: bool) -> list[Perturbation]:
    es = esbox.make_strategy("openai_es", 4, population=population, antithetic=antithetic)
    return es.ask()


# -- dealing a population out (no Ray) -----------------------------------------------------------
@pytest.mark.parametrize(("population", "antithetic"), [(8, True), (12, True), (7, False)])
@pytest.mark.parametrize("keep_twins", [True, False])
def test_units_cover_the_population_in_order_and_keep_twins_together_when_asked(
    population: int, antithetic: bool, keep_twins: bool
) -> None:
    perturbations = members(population, antithetic)
    units = work_units(perturbations, keep_twins)
    assert units[0][0] == 0 and units[-1][1] == population
    assert all(a[1] == b[0] for a, b in itertools.pairwise(units))
    sizes = {hi - lo for lo, hi in units}
    assert sizes == ({2} if keep_twins and antithetic else {1})
    for lo, hi in units:
        if hi - lo == 2:
            assert perturbations[lo + 1].mirrors(perturbations[lo])


def test_chunks_follow_the_measured_speed_and_keep_the_tail_balanced() -> None:
    pending = [(i, i + 1) for i in range(40)]
    assert chunk_length(pending, None, workers=2) == 1  # unmeasured: one unit
    assert chunk_length(pending, 0.5, workers=2) == 1  # slow: one member at a time
    assert chunk_length(pending, 0.01, workers=2, target_seconds=0.1) == 10  # fills 0.1 s
    assert chunk_length(pending, 1e-6, workers=2) == 10  # at most half of an equal share
    assert chunk_length(pending[:3], 1e-6, workers=2) == 1
    assert chunk_length([], 0.01, workers=2) == 0
    pairs = [(i, i + 2) for i in range(0, 40, 2)]
    assert chunk_length(pairs, 0.01, workers=2, target_seconds=0.1) == 5  # 10 members
    assert measured(None, 1.0, 4) == 0.25 and measured(0.25, 2.0, 4) == 0.375


# -- replicas stay bit-identical -----------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["openai_es", "copes"])
def test_pool_run_is_bit_identical_to_one_process(pool: RayPool, strategy: str) -> None:
    space, evaluator = REPLICA()
    single = run(space, evaluator, strategy, steps=4)
    pooled = run(pool.space, pool, strategy, steps=4)
    assert history(pooled) == history(single)
    assert pool.space.vector.tobytes() == space.vector.tobytes()
    expected = state_checksum(space)
    assert pool.checksums() == [expected, expected]
    assert pool.verify() == expected
    assert pool.best_value == evaluator.best_value
    assert np.array_equal(pool.best_x, evaluator.best_x)
    bests = ray.get([a.evaluator_attribute.remote("best_value") for a in pool.actors])
    assert all(math.isfinite(b) for b in bests)  # both actors did score members


def test_a_step_sends_specs_not_parameters(ray_session) -> None:
    big = VectorReplica(ROSENBROCK, np.zeros(100_000))  # one copy of x: 800 kB
    with RayPool(big, 2, actor_options=HALF_CPU, local_replica=False) as pool:
        before = pool.traffic
        run(pool.space, pool, "openai_es", steps=3)
        after = pool.traffic
    calls = (after.calls - before.calls) / 3
    assert calls >= 2 + 2  # at least a chunk of members and an update for each actor
    assert 0 < (after.sent - before.sent) / 3 < 400 * calls  # specs: a few hundred bytes a call
    assert after.received > before.received


def test_a_replica_that_drifts_is_caught_and_a_reload_resyncs_it(pool: RayPool) -> None:
    stray = Update(run_seed=0, step=0, terms=(Term(seed=5, coefficient=1.0),), learning_rate=0.1)
    ray.get(pool.actors[1].apply.remote(stray.to_dict()))
    with pytest.raises(PoolError, match=r"actor 1 of 2 .* holds other parameters"):
        pool.verify()
    with pytest.raises(PoolError, match="unusable: actor 1 of 2"):
        pool.evaluate(pool.space, members(2, True))
    pool.space.load_state_dict(pool.space.state_dict())  # the driver's copy is the reference
    assert pool.verify() == state_checksum(REPLICA()[0])


# -- failures --------------------------------------------------------------------------------------
def test_a_failing_evaluation_names_the_actor_and_restores_every_replica(pool: RayPool) -> None:
    before = pool.verify()
    population = [Perturbation(0, 0, seed, 0.1) for seed in range(3)]
    population.append(Perturbation(0, 0, 99, 1e6))  # member 3: out of range
    with pytest.raises(PoolError, match=r"actor [01] of 2 .* member 3 of step 0") as info:
        pool.evaluate(pool.space, population)
    assert str(info.value).endswith("ValueError: x is out of range")
    assert isinstance(info.value.__cause__, ValueError)
    assert pool.verify() == before  # the sweep restored the weights it had perturbed
    space, evaluator = REPLICA()
    expected = evaluator.evaluate(space, population[:3])
    assert pool.evaluate(pool.space, population[:3]).tobytes() == expected.tobytes()


def test_pool_refuses_a_space_other_than_its_own(pool: RayPool) -> None:
    with pytest.raises(TypeError, match=r"pool\.space"):
        pool.evaluate(pool.local, members(2, True))


def kill(pool: RayPool, actor: int) -> None:
    """SIGKILL the actor's process, as the kernel's OOM killer would (ray.kill is lazy)."""
    os.kill(ray.get(pool.actors[actor].describe.remote())["pid"], signal.SIGKILL)


def test_without_retries_a_dead_actor_is_named_and_a_lost_update_stops_the_pool(
    ray_session,
) -> None:
    pool = RayPool(REPLICA, 2, actor_options=HALF_CPU, local_replica=False, retries=0)
    try:
        kill(pool, 1)
        died = r"actor 1 of 2 .* died while evaluating member 1 of step 0, .*\(retries=0\)"
        with pytest.raises(PoolError, match=died):
            pool.evaluate(pool.space, members(4, False))
        assert not pool.replacements
        pool.retries = 1  # the next step may replace one actor
        population = members(4, False)
        assert pool.evaluate(pool.space, population).tobytes() == (
            REPLICA()[1].evaluate(REPLICA()[0], population).tobytes()
        )
        assert [r.actor for r in pool.replacements] == [1]
        pool.retries = 0
        kill(pool, 1)
        es = esbox.make_strategy("openai_es", pool.space, **STRATEGY_OPTIONS["openai_es"])
        update = es.tell(np.arange(float(len(es.ask()))))
        with pytest.raises(PoolError, match=r"actor 1 of 2 .* died while applying the update"):
            pool.space.apply(update)
        with pytest.raises(PoolError, match="unusable: the update of step 0 did not reach"):
            pool.evaluate(pool.space, members(4, True))
    finally:
        pool.close()


def test_a_factory_that_fails_in_the_actor_is_reported(ray_session) -> None:
    broken = VectorReplica(fussy, [np.nan])  # VectorSpace refuses a non-finite x0
    with pytest.raises(PoolError, match="actor 0 of 1 died while starting") as info:
        RayPool(broken, 1, actor_options=HALF_CPU, local_replica=False)
    assert "x0 must be finite" in str(info.value)


# -- resume ----------------------------------------------------------------------------------------
def test_resume_recreates_the_pool_bit_identically(pool: RayPool, tmp_path) -> None:
    space, evaluator = REPLICA()
    uninterrupted = run(space, evaluator, "openai_es", steps=6)
    pooled, single = tmp_path / "pooled", tmp_path / "single"
    options = STRATEGY_OPTIONS["openai_es"]
    run(pool.space, pool, "openai_es", steps=3, checkpoint_dir=pooled, checkpoint_every=1)
    run(*REPLICA(), "openai_es", steps=3, checkpoint_dir=single, checkpoint_every=1)
    # a new pool from the same factory; no driver replica: checkpoints come from actor 0
    with RayPool(REPLICA, 2, actor_options=HALF_CPU, local_replica=False) as fresh:
        for source in (pooled, single):  # a one-process checkpoint resumes on a pool too
            es = esbox.make_strategy("openai_es", fresh.space, seed=7, **options)
            resumed = fresh.runner(es, Budget(max_steps=6), checkpoint_dir=source)
            resumed.resume(source)
            assert fresh.verify() == state_checksum(pool.space)  # every actor loaded step 3
            resumed.run()
            assert history(resumed) == history(uninterrupted)
            assert fresh.checksums() == [state_checksum(space)] * 2
            assert fresh.best_value == evaluator.best_value
            assert np.array_equal(fresh.best_x, evaluator.best_x)
