"""Parameter spaces: exact restore, replayed perturbations and updates, low precision, state.

The update-by-replay tests compare against a slow reference that materialises every noise
direction as a row of an explicit N x d matrix, with its own chunk layout.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import esbox
from esbox.noise import chunk_noise
from esbox.partition import chunk_labels
from esbox.space import ParameterSpace, VectorSpace
from esbox.specs import OptimizerSpec, Perturbation, Term, Update

VECTOR_DTYPES = [torch.float32, torch.float64]


# -- the slow reference --------------------------------------------------------------------------
def reference_layout(numels: list[int], chunk_size: int) -> list[tuple[int, int, int, int]]:
    """(tensor, chunk, start, stop) of every chunk, written out independently of the space."""
    out = []
    for t, n in enumerate(numels):
        for c in range((n + chunk_size - 1) // chunk_size):
            out.append((t, c, c * chunk_size, min((c + 1) * chunk_size, n)))
    return out


def reference_span(numels: list[int], chunk_size: int) -> int:
    """The layout's longest chunk: the length of a step's partition pattern."""
    return max(stop - start for _, _, start, stop in reference_layout(numels, chunk_size))


def noise_row(
    numels: list[int],
    chunk_size: int,
    run_seed: int,
    step: int,
    seed: int,
    subspace: int = 0,
    num_subspaces: int = 1,
) -> np.ndarray:
    """One member's masked noise over the whole layout as a float64 vector."""
    row, span = [], reference_span(numels, chunk_size)
    for t, c, start, stop in reference_layout(numels, chunk_size):
        eps = chunk_noise(run_seed, step, seed, t, c, stop - start).double().numpy()
        if num_subspaces > 1:
            labels = chunk_labels(run_seed, step, num_subspaces, t, c, stop - start, span).numpy()
            eps = eps * (labels == subspace)
        row.append(eps)
    return np.concatenate(row)


def noise_matrix(numels: list[int], chunk_size: int, update: Update) -> np.ndarray:
    """The N x d matrix of the update's (masked) noise directions."""
    return np.stack(
        [
            noise_row(
                numels,
                chunk_size,
                update.run_seed,
                update.step,
                t.seed,
                t.subspace,
                t.num_subspaces,
            )
            for t in update.terms
        ]
    )


class ReferenceOptimizer:
    """Hand-written SGD (momentum) and Adam with decoupled weight decay, in float64 numpy."""

    def __init__(self, d: int) -> None:
        self.m = np.zeros(d)
        self.v = np.zeros(d)
        self.velocity = np.zeros(d)
        self.t = 0

    def step(self, theta: np.ndarray, grad: np.ndarray, lr: float, opt: OptimizerSpec):
        self.t += 1
        if opt.name == "adam":
            self.m = opt.beta1 * self.m + (1 - opt.beta1) * grad
            self.v = opt.beta2 * self.v + (1 - opt.beta2) * grad**2
            m_hat = self.m / (1 - opt.beta1**self.t)
            v_hat = self.v / (1 - opt.beta2**self.t)
            delta = lr * m_hat / (np.sqrt(v_hat) + opt.eps)
        elif opt.momentum:
            self.velocity = opt.momentum * self.velocity + grad
            delta = lr * self.velocity
        else:
            delta = lr * grad
        return theta + delta - lr * opt.weight_decay * theta


def reference_apply(theta, numels, chunk_size, update, optimizer: ReferenceOptimizer):
    """theta + optimizer(lr, sum_j coefficient_j * eps_j) with explicit noise matrices."""
    coefficients = np.array([t.coefficient for t in update.terms])
    grad = coefficients @ noise_matrix(numels, chunk_size, update)
    return optimizer.step(theta, grad, update.learning_rate, update.optimizer)


def random_update(rng, run_seed, step, n_terms, num_subspaces=1, lr=0.05, optimizer=None):
    terms = tuple(
        Term(
            seed=int(rng.integers(2**62)),
            coefficient=float(rng.normal()),
            subspace=int(rng.integers(num_subspaces)),
            num_subspaces=num_subspaces,
        )
        for _ in range(n_terms)
    )
    return Update(run_seed, step, terms, lr, optimizer or OptimizerSpec())


# -- VectorSpace: restore ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", VECTOR_DTYPES)
def test_vector_space_restores_exactly(dtype) -> None:
    x0 = np.random.default_rng(0).normal(size=101) * 1e3
    space = VectorSpace(x0, dtype=dtype, chunk_size=16)
    before = space.vector.copy()
    address = space.vector.ctypes.data
    for seed in range(5):
        with space.perturbed(Perturbation(7, 0, seed, 0.37)):
            assert not np.array_equal(space.vector, before)
        assert np.array_equal(space.vector, before)
    assert space.vector.ctypes.data == address  # edited in place, never reallocated


@pytest.mark.parametrize("dtype", VECTOR_DTYPES)
def test_vector_space_restores_when_the_body_raises(dtype) -> None:
    space = VectorSpace(np.linspace(-1, 1, 50), dtype=dtype)
    before = space.vector.copy()
    with pytest.raises(ZeroDivisionError), space.perturbed(Perturbation(0, 0, 1, 0.5)):
        assert not np.array_equal(space.vector, before)
        raise ZeroDivisionError
    assert np.array_equal(space.vector, before)
    with space.perturbed(Perturbation(0, 0, 1, 0.5)):  # usable again afterwards
        pass
    assert np.array_equal(space.vector, before)


@pytest.mark.parametrize("dtype", VECTOR_DTYPES)
@given(
    x=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40),
    scale=st.floats(-10, 10).filter(lambda s: s != 0),
    seed=st.integers(0, 2**62),
    chunk=st.integers(1, 17),
)
def test_restore_is_exact_for_any_vector(dtype, x, scale, seed, chunk) -> None:
    space = VectorSpace(x, dtype=dtype, chunk_size=chunk)
    before = space.vector.copy()
    with space.perturbed(Perturbation(1, 2, seed, scale)):
        pass
    assert np.array_equal(space.vector, before)


def test_perturbed_does_not_nest_and_blocks_apply() -> None:
    space = VectorSpace(np.zeros(5))
    p = Perturbation(0, 0, 1, 1.0)
    with space.perturbed(p):
        with pytest.raises(RuntimeError, match="nest"), space.perturbed(p):
            pass
        with pytest.raises(RuntimeError, match="perturbed"):
            space.apply(Update(0, 0, (), 0.1))
    assert np.array_equal(space.vector, np.zeros(5))


@pytest.mark.parametrize("dtype", VECTOR_DTYPES)
def test_perturbed_values_are_theta_plus_scaled_noise(dtype) -> None:
    d, chunk_size = 70, 32
    x0 = np.random.default_rng(3).normal(size=d)
    space = VectorSpace(x0, dtype=dtype, chunk_size=chunk_size)
    theta = space.vector.astype(np.float64)
    p = Perturbation(run_seed=5, step=3, seed=12345, scale=-0.25)
    expected = theta + p.scale * noise_row([d], chunk_size, 5, 3, 12345)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(space.materialize(p), expected, rtol=tol, atol=tol)
    assert np.array_equal(space.vector, theta.astype(space.vector.dtype))


def test_space_noise_matches_the_reference_rows() -> None:
    numels, chunk_size = [30, 45, 8], 16
    space = ParameterSpace([torch.zeros(n) for n in numels], chunk_size=chunk_size)
    for k, s in [(1, 0), (3, 0), (3, 2)]:
        p = Perturbation(9, 4, 77, 2.0, subspace=s, num_subspaces=k)
        got = np.concatenate([eps.double().numpy().copy() for _, eps in space.noise(p)])
        np.testing.assert_array_equal(got, 2.0 * noise_row(numels, chunk_size, 9, 4, 77, s, k))


@pytest.mark.parametrize("k", [2, 3, 5])
def test_subspace_perturbation_leaves_other_coordinates_untouched(k: int) -> None:
    d, chunk_size = 97, 20
    x0 = np.random.default_rng(0).normal(size=d)
    space = VectorSpace(x0, chunk_size=chunk_size)
    labels = np.concatenate(
        [
            chunk_labels(2, 6, k, t, c, b - a, reference_span([d], chunk_size)).numpy()
            for t, c, a, b in reference_layout([d], chunk_size)
        ]
    )
    moved = np.zeros(d, dtype=int)
    for s in range(k):
        diff = space.materialize(Perturbation(2, 6, 31, 0.5, subspace=s, num_subspaces=k)) - x0
        assert np.all(diff[labels != s] == 0.0)
        assert np.all(diff[labels == s] != 0.0)
        moved += diff != 0
    assert np.all(moved == 1)


def test_vector_space_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="float32 or float64"):
        VectorSpace([1.0, 2.0], dtype="float16")
    with pytest.raises(ValueError, match="at least one"):
        VectorSpace([])
    with pytest.raises(ValueError, match="finite"):
        VectorSpace([1.0, float("nan")])
    with pytest.raises(ValueError, match="chunk_size"):
        VectorSpace([1.0], chunk_size=0)


# -- updates by replay vs explicit noise matrices -----------------------------------------------
@pytest.mark.parametrize("dtype", VECTOR_DTYPES)
@pytest.mark.parametrize("num_subspaces", [1, 4])
def test_sgd_update_by_replay_equals_explicit_noise_matrix(dtype, num_subspaces) -> None:
    d, chunk_size = 150, 64
    rng = np.random.default_rng(num_subspaces)
    x0 = rng.normal(size=d)
    space = VectorSpace(x0, dtype=dtype, chunk_size=chunk_size)
    theta = space.vector.astype(np.float64)
    optimizer = ReferenceOptimizer(d)
    tol = 2e-6 if dtype == torch.float32 else 1e-12
    for step in range(3):
        update = random_update(rng, 11, step, n_terms=12, num_subspaces=num_subspaces)
        theta = reference_apply(theta, [d], chunk_size, update, optimizer)
        norm = space.apply(update)
        np.testing.assert_allclose(space.vector, theta, rtol=tol, atol=tol)
        assert norm > 0
        theta = space.vector.astype(np.float64)  # follow the space's own rounding


@pytest.mark.parametrize("dtype", VECTOR_DTYPES)
@pytest.mark.parametrize(
    "optimizer",
    [
        OptimizerSpec("adam"),
        OptimizerSpec("adam", beta1=0.5, beta2=0.9, weight_decay=0.1),
        OptimizerSpec("sgd", momentum=0.9),
        OptimizerSpec("sgd", weight_decay=0.5),
    ],
    ids=["adam", "adamw", "momentum", "sgd-wd"],
)
def test_stateful_optimizers_equal_the_hand_written_ones(dtype, optimizer) -> None:
    d, chunk_size = 90, 40
    rng = np.random.default_rng(5)
    space = VectorSpace(rng.normal(size=d), dtype=dtype, chunk_size=chunk_size)
    theta = space.vector.astype(np.float64)
    reference = ReferenceOptimizer(d)
    tol = 1e-5 if dtype == torch.float32 else 1e-11
    for step in range(6):
        update = random_update(rng, 3, step, 8, num_subspaces=2, lr=0.01 * (step + 1))
        update = Update(update.run_seed, update.step, update.terms, update.learning_rate, optimizer)
        theta = reference_apply(theta, [d], chunk_size, update, reference)
        space.apply(update)
        np.testing.assert_allclose(space.vector, theta, rtol=tol, atol=tol)


def test_adam_step_size_is_about_the_learning_rate() -> None:
    """First Adam step: m_hat / sqrt(v_hat) = sign(g), so every coordinate moves by ~lr."""
    space = VectorSpace(np.zeros(64))
    update = random_update(np.random.default_rng(0), 0, 0, 4, lr=0.003)
    update = Update(0, 0, update.terms, 0.003, OptimizerSpec("adam"))
    space.apply(update)
    np.testing.assert_allclose(np.abs(space.vector), 0.003, rtol=1e-4)


def test_apply_returns_the_norm_of_the_change() -> None:
    space = VectorSpace(np.ones(40))
    update = random_update(np.random.default_rng(2), 0, 0, 5)
    norm = space.apply(update)
    assert norm == pytest.approx(np.linalg.norm(space.vector - 1.0), rel=1e-12)


def test_empty_and_zero_updates_change_nothing() -> None:
    space = VectorSpace(np.arange(10.0))
    assert space.apply(Update(0, 0, (), 0.1)) == 0.0
    assert space.apply(Update(0, 1, (Term(5, 0.0),), 0.1)) == 0.0
    assert np.array_equal(space.vector, np.arange(10.0))


def test_update_touches_each_coordinate_only_through_its_subspace() -> None:
    d, chunk_size, k = 120, 50, 3
    rng = np.random.default_rng(8)
    update = random_update(rng, 1, 0, 9, num_subspaces=k)
    full = VectorSpace(np.zeros(d), chunk_size=chunk_size)
    full.apply(update)
    total = np.zeros(d)
    labels = np.concatenate(
        [
            chunk_labels(1, 0, k, t, c, b - a, reference_span([d], chunk_size)).numpy()
            for t, c, a, b in reference_layout([d], chunk_size)
        ]
    )
    for s in range(k):
        only = Update(1, 0, tuple(t for t in update.terms if t.subspace == s), 0.05)
        part = VectorSpace(np.zeros(d), chunk_size=chunk_size)
        part.apply(only)
        assert np.all(part.vector[labels != s] == 0.0)
        total += part.vector
    assert np.array_equal(full.vector, total)


def test_replicas_stay_bit_identical_through_serialised_updates() -> None:
    rng = np.random.default_rng(4)
    x0 = rng.normal(size=64)
    a, b = VectorSpace(x0, chunk_size=16), VectorSpace(x0, chunk_size=16)
    for step in range(4):
        update = random_update(rng, 0, step, 6, num_subspaces=2, optimizer=OptimizerSpec("adam"))
        wire = json.loads(json.dumps(update.to_dict()))
        a.apply(update)
        b.apply(Update.from_dict(wire))
    assert np.array_equal(a.vector, b.vector)


def test_unknown_optimizer_is_refused_before_touching_parameters() -> None:
    space = VectorSpace(np.ones(4))
    with pytest.raises(esbox.ConfigError, match="sgd"):
        space.apply(Update(0, 0, (Term(1, 1.0),), 0.1, OptimizerSpec("lion")))
    assert np.array_equal(space.vector, np.ones(4))


# -- a generic space of several torch tensors, low precision included ---------------------------
def mixed_tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(3, 7, generator=g),
        torch.randn(40, generator=g).to(torch.bfloat16),
        torch.randn(5, 5, generator=g).to(torch.float16),
        torch.randn(2, 3, 4, generator=g).double(),
    ]


def snapshot(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensors]


def bit_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(
        x.dtype == y.dtype and torch.equal(x.view(-1), y.view(-1))
        for x, y in zip(a, b, strict=True)
    )


def test_mixed_precision_space_restores_exactly() -> None:
    tensors = mixed_tensors()
    space = ParameterSpace(tensors, chunk_size=9)
    before = snapshot(tensors)
    addresses = [t.data_ptr() for t in tensors]
    for seed in range(4):
        with space.perturbed(Perturbation(0, 0, seed, 0.05)):
            assert all(not torch.equal(t, b) for t, b in zip(tensors, before, strict=True))
        assert bit_equal(tensors, before)
    with pytest.raises(KeyError), space.perturbed(Perturbation(0, 0, 9, 3.0)):
        raise KeyError("evaluation failed")
    assert bit_equal(tensors, before)
    assert [t.data_ptr() for t in tensors] == addresses


@pytest.mark.parametrize("num_subspaces", [1, 3])
def test_low_precision_perturbation_is_the_rounded_fp32_sum(num_subspaces) -> None:
    base = torch.linspace(-2, 2, 33)
    tensors = [base.to(torch.bfloat16), base.to(torch.float16)]
    masters = [t.float() for t in tensors]
    space = ParameterSpace(tensors, chunk_size=33)
    member = Perturbation(1, 1, 1, 0.01, subspace=num_subspaces - 1, num_subspaces=num_subspaces)
    row = torch.from_numpy(noise_row([33, 33], 33, 1, 1, 1, member.subspace, num_subspaces))
    with space.perturbed(member):
        for i, t in enumerate(tensors):
            eps = row[33 * i : 33 * (i + 1)].float()
            assert torch.equal(t, (masters[i] + eps * 0.01).to(t.dtype))
    assert all(torch.equal(t, m.to(t.dtype)) for t, m in zip(tensors, masters, strict=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_small_updates_to_low_precision_weights_are_not_lost(dtype) -> None:
    """2e-5 steps on weights near 1 round away in bf16/fp16; the fp32 master keeps them."""
    weights = torch.ones(256, dtype=dtype)
    space = ParameterSpace([weights])
    eps = chunk_noise(0, 0, 3, 0, 0, 256)
    master, naive = torch.ones(256), torch.ones(256, dtype=dtype)
    for _ in range(500):
        space.apply(Update(0, 0, (Term(seed=3, coefficient=1.0),), 2e-5))
        master.add_(eps * 2e-5)
        naive += (eps * 2e-5).to(dtype)
    assert torch.equal(naive, torch.ones(256, dtype=dtype))  # the failure mode being guarded
    assert torch.equal(weights, master.to(dtype))
    assert (weights != 1).float().mean() > 0.5
    # a later perturbation restores to the same rounded weights
    kept = weights.clone()
    with space.perturbed(Perturbation(0, 1, 1, 0.1)):
        assert not torch.equal(weights, kept)
    assert torch.equal(weights, kept)


def test_mixed_space_update_equals_reference() -> None:
    tensors = mixed_tensors()
    numels = [t.numel() for t in tensors]
    chunk_size = 10
    space = ParameterSpace(tensors, chunk_size=chunk_size)
    # the exact unperturbed values: fp32 masters for low precision, the tensor otherwise
    theta = np.concatenate([t.double().view(-1).numpy() for t in tensors])
    reference = ReferenceOptimizer(sum(numels))
    rng = np.random.default_rng(0)
    for step in range(3):
        update = random_update(rng, 2, step, 5, num_subspaces=3, lr=0.01)
        theta = reference_apply(theta, numels, chunk_size, update, reference)
        space.apply(update)
    got = np.concatenate([t.double().view(-1).numpy() for t in tensors])
    offsets = np.cumsum([0, *numels])
    for i, t in enumerate(tensors):
        part = slice(offsets[i], offsets[i + 1])
        rounded = torch.from_numpy(theta[part]).to(t.dtype).double().numpy()
        tol = {torch.bfloat16: 1e-2, torch.float16: 1e-3, torch.float32: 1e-6}.get(t.dtype, 1e-12)
        np.testing.assert_allclose(got[part], rounded, rtol=tol, atol=tol)


def test_space_state_dict_round_trip_continues_identically() -> None:
    rng = np.random.default_rng(1)
    updates = [
        random_update(rng, 0, s, 4, num_subspaces=2, optimizer=OptimizerSpec("adam"))
        for s in range(6)
    ]
    a_tensors = mixed_tensors()
    a = ParameterSpace(a_tensors, chunk_size=11)
    for u in updates[:3]:
        a.apply(u)
    state = a.state_dict()
    assert all(v.device.type == "cpu" for v in state.values())
    b_tensors = mixed_tensors()
    b = ParameterSpace(b_tensors, chunk_size=11)
    b.load_state_dict(state)
    assert bit_equal(a_tensors, b_tensors)
    for u in updates[3:]:
        a.apply(u)
        b.apply(u)
    assert bit_equal(a_tensors, b_tensors)


def test_load_state_dict_refuses_other_shapes_and_dtypes() -> None:
    state = ParameterSpace([torch.zeros(4)]).state_dict()
    with pytest.raises(ValueError, match="tensor 0"):
        ParameterSpace([torch.zeros(5)]).load_state_dict(state)
    with pytest.raises(ValueError, match="tensor 0"):
        ParameterSpace([torch.zeros(4, dtype=torch.float64)]).load_state_dict(state)


def test_dimension_counts_every_tensor() -> None:
    assert ParameterSpace(mixed_tensors()).dimension == 21 + 40 + 25 + 24
    assert VectorSpace(np.zeros(13)).dimension == 13


def test_parallel_noise_threads_give_bit_identical_perturbations_and_updates():
    """Chunks drawn ahead in threads replay exactly like the serial path (big chunks only)."""
    torch.manual_seed(0)
    tensors = [torch.randn(300_000), torch.randn(150_000).to(torch.bfloat16)]
    spaces = [
        esbox.ParameterSpace([t.clone() for t in tensors], chunk_size=100_000, noise_threads=n)
        for n in (1, 3)
    ]
    es = esbox.make_strategy("copes", spaces[0], seed=5, population=8, subspaces=2)
    members = es.ask()
    seen = []
    for space in spaces:
        noises = [torch.cat([eps.clone() for _, eps in space.noise(p)]) for p in members[:3]]
        with space.perturbed(members[1]):
            perturbed = [t.clone() for t in space._flat]
        seen.append((noises, perturbed))
    for a, b in zip(seen[0][0] + seen[0][1], seen[1][0] + seen[1][1], strict=True):
        assert torch.equal(a, b)
    update = es.tell(np.arange(8.0))
    for space in spaces:
        space.apply(update)
    for a, b in zip(spaces[0]._flat, spaces[1]._flat, strict=True):
        assert torch.equal(a, b)


def test_an_abandoned_noise_stream_leaves_later_noise_intact():
    space = esbox.ParameterSpace([torch.zeros(400_000)], chunk_size=100_000, noise_threads=3)
    es = esbox.make_strategy("openai_es", space, seed=1, population=4)
    p = es.ask()[0]
    expected = torch.cat([eps.clone() for _, eps in space.noise(p)])
    stream = space.noise(p)
    next(stream)
    stream.close()  # stop after one chunk while others are being drawn
    assert torch.equal(torch.cat([eps.clone() for _, eps in space.noise(p)]), expected)
