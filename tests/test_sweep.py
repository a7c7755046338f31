"""Sweeps (members held in turn, one restore), antithetic reflection and the partition's masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import esbox
import esbox.noise
from esbox.adapters.models.space import TorchModuleSpace
from esbox.adapters.models.testing import tiny_causal_lm
from esbox.chunks import chunk_layout
from esbox.partition import LayoutPartition, chunk_labels
from esbox.space import VectorSpace
from esbox.specs import Perturbation, Term, Update


def members(space, name: str, population: int = 8, **options) -> list[Perturbation]:
    defaults = {"sigma": 0.3, **({"subspaces": 2} if name == "copes" else {})}
    strategy = esbox.make_strategy(
        name, space, seed=5, population=population, **{**defaults, **options}
    )
    return strategy.ask()


# -- sweep --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@given(
    x=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40),
    chunk=st.integers(1, 17),
    name=st.sampled_from(["openai_es", "copes"]),
)
def test_sweep_holds_each_member_exactly_as_perturbed_does(dtype, x, chunk, name) -> None:
    space = VectorSpace(x, dtype=dtype, chunk_size=chunk)
    before = space.vector.copy()
    population = members(space, name)
    alone = [space.materialize(p) for p in population]
    with space.sweep(population) as sweep:
        seen = [space.vector.copy() for _ in sweep]
    assert all(np.array_equal(a, b) for a, b in zip(alone, seen, strict=True))
    assert np.array_equal(space.vector, before)


def test_sweep_restores_after_an_exception_or_an_early_break() -> None:
    space = VectorSpace(np.linspace(-2, 2, 37), chunk_size=8)
    before = space.vector.copy()
    population = members(space, "openai_es")
    with pytest.raises(ZeroDivisionError), space.sweep(population) as sweep:
        for i, _ in enumerate(sweep):
            assert not np.array_equal(space.vector, before)
            if i == 3:
                raise ZeroDivisionError
    assert np.array_equal(space.vector, before)
    with space.sweep(population) as sweep:
        next(sweep)
    assert np.array_equal(space.vector, before)


def test_a_sweep_cannot_be_iterated_after_it_ends_or_nested() -> None:
    space = VectorSpace(np.zeros(6))
    population = members(space, "openai_es", population=4)
    with space.sweep(population) as sweep:
        next(sweep)
        with pytest.raises(RuntimeError, match="nest"), space.sweep(population):
            pass
    with pytest.raises(RuntimeError, match="ended"):
        next(sweep)
    assert np.array_equal(space.vector, np.zeros(6))


# -- antithetic reflection ---------------------------------------------------------------------
def count_draws(monkeypatch) -> list[int]:
    calls = [0]
    original = esbox.noise.fill_noise

    def counted(out, seed):
        calls[0] += 1
        return original(out, seed)

    monkeypatch.setattr(esbox.noise, "fill_noise", counted)
    return calls


@pytest.mark.parametrize("name", ["openai_es", "copes"])
def test_reflection_halves_the_draws_and_lands_within_a_rounding(monkeypatch, name) -> None:
    x0 = np.random.default_rng(1).normal(size=300)
    exact = VectorSpace(x0, dtype="float32", chunk_size=64)
    reflected = VectorSpace(x0, dtype="float32", chunk_size=64)
    reflected.reflect_antithetic = True
    population = members(exact, name)
    assert all(p.scale == -q.scale for p, q in zip(population[::2], population[1::2], strict=True))
    with exact.sweep(population) as sweep:
        want = [exact.vector.copy() for _ in sweep]
    calls = count_draws(monkeypatch)
    with reflected.sweep(population) as sweep:
        got = [reflected.vector.copy() for _ in sweep]
    assert calls[0] == len(population) // 2 * len(reflected.chunks)
    assert all(np.array_equal(a, b) for a, b in zip(want[::2], got[::2], strict=True))
    tolerance = 2 * np.finfo(np.float32).eps * (np.abs(x0) + 0.3 * 4 * 2)
    for a, b in zip(want[1::2], got[1::2], strict=True):
        assert np.all(np.abs(a - b) <= tolerance)
    assert np.array_equal(reflected.vector, x0.astype(np.float32))


def test_a_twin_mirrors_only_its_partner() -> None:
    plus = Perturbation(run_seed=1, step=2, seed=3, scale=0.5, subspace=1, num_subspaces=4)
    minus = Perturbation(run_seed=1, step=2, seed=3, scale=-0.5, subspace=1, num_subspaces=4)
    assert minus.mirrors(plus) and plus.mirrors(minus)
    assert not plus.mirrors(plus)  # the same side
    for change in ({"seed": 4}, {"step": 3}, {"run_seed": 2}, {"subspace": 2}, {"scale": -0.4}):
        other = Perturbation(**{**minus.to_dict(), **change})
        assert not other.mirrors(plus), change


def test_update_terms_group_by_subspace_in_first_seen_order() -> None:
    terms = (
        Term(seed=1, coefficient=1.0, subspace=2, num_subspaces=4),
        Term(seed=2, coefficient=1.0, subspace=0, num_subspaces=4),
        Term(seed=3, coefficient=1.0, subspace=2, num_subspaces=4),
        Term(seed=4, coefficient=1.0, subspace=5, num_subspaces=1),  # no mask: subspace ignored
        Term(seed=5, coefficient=1.0, subspace=0, num_subspaces=1),
    )
    groups = Update(run_seed=0, step=0, terms=terms, learning_rate=0.1).subspace_groups()
    assert [[t.seed for t in group] for group in groups] == [[1, 3], [2], [4, 5]]


def test_reflection_needs_the_twin_right_after_its_partner() -> None:
    space = VectorSpace(np.zeros(50), dtype="float32")
    space.reflect_antithetic = True
    plus, minus, other = members(space, "openai_es", population=4)[:3]
    with space.sweep([plus, other, minus]) as sweep:  # minus follows other: drawn, exact
        got = [space.vector.copy() for _ in sweep]
    assert np.array_equal(got[2], space.materialize(minus))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_reflection_on_a_model_restores_exactly(dtype) -> None:
    model = tiny_causal_lm("llama", vocab_size=64, seed=0).to(dtype).requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    space = TorchModuleSpace(model, chunk_size=1000, reflect_antithetic=True)
    population = members(space, "copes", sigma=0.01)
    twin_exact = TorchModuleSpace(
        tiny_causal_lm("llama", vocab_size=64, seed=0).to(dtype).requires_grad_(False),
        chunk_size=1000,
    )
    with twin_exact.perturbed(population[1]):
        want = {k: v.float().clone() for k, v in twin_exact.module.state_dict().items()}
    with space.sweep(population) as sweep:
        for i, _ in enumerate(sweep):
            if i == 1:
                got = {k: v.float() for k, v in model.state_dict().items()}
                for key in want:  # one rounding of the weight dtype at most
                    step = torch.finfo(dtype).eps * (want[key].abs() + 0.1)
                    assert torch.all((got[key] - want[key]).abs() <= 2 * step), key
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- the partition's masks ---------------------------------------------------------------------
@given(
    k=st.integers(1, 300),
    numels=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    chunk_size=st.integers(1, 200),
    seed=st.integers(0, 2**40),
)
def test_layout_partition_masks_are_the_chunk_labels(k, numels, chunk_size, seed) -> None:
    chunks = chunk_layout(numels, chunk_size)
    span = max(c.numel for c in chunks)
    partition, cpu = LayoutPartition(chunks, span), torch.device("cpu")
    for subspace in {0, k // 2, k - 1}:  # a sweep's order: the chunks of one subspace
        for position, c in enumerate(chunks):
            labels = chunk_labels(seed, 3, k, c.tensor_index, c.chunk_index, c.numel, span)
            want = (labels == subspace).to(torch.float32)
            assert torch.equal(partition.mask(position, cpu, seed, 3, k, subspace), want)
    for position, c in enumerate(chunks):  # an update's order: every subspace at each chunk
        labels = chunk_labels(seed, 3, k, c.tensor_index, c.chunk_index, c.numel, span)
        for subspace in {0, k // 2, k - 1}:
            want = (labels == subspace).to(torch.float32)
            alone = partition.mask(position, cpu, seed, 3, k, subspace, shared=False)
            assert torch.equal(alone, want)
            # the shared mask is compared again after a chunk's own overwrote its buffer
            assert torch.equal(partition.mask(position, cpu, seed, 3, k, subspace), want)


@pytest.mark.parametrize("noise", ["generator", "table"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_buffers_first_made_in_inference_mode_work_outside_it(noise, dtype) -> None:
    model = tiny_causal_lm("llama", vocab_size=64, seed=0).to(dtype).requires_grad_(False)
    with torch.inference_mode():
        space = TorchModuleSpace(model, chunk_size=500, noise=noise, table_size=4096)
    strategy = esbox.make_strategy("copes", space, seed=1, population=4, subspaces=2, sigma=0.01)
    with space.sweep(strategy.ask()) as sweep, torch.inference_mode():
        rewards = [float(i) for i, _ in enumerate(sweep)]
    assert space.apply(strategy.tell(rewards)) > 0
