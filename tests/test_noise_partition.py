"""Seed-replayed chunk noise and K-way random partitions (DESIGN sections 3 and 5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from esbox.chunks import chunk_layout
from esbox.noise import NOISE_DTYPE, chunk_noise, derive_seed
from esbox.partition import (
    chunk_labels,
    chunk_window,
    label_dtype,
    pattern_length,
    step_pattern,
)
from esbox.space import ParameterSpace, VectorSpace
from esbox.specs import Perturbation

seeds = st.integers(0, 2**62)


def layout_chunk_labels(numels, chunk_size, run_seed, step, k):
    """Labels of every chunk of a multi-tensor layout, in layout order."""
    chunks = chunk_layout(numels, chunk_size)
    span = max(c.numel for c in chunks)
    return [
        chunk_labels(run_seed, step, k, c.tensor_index, c.chunk_index, c.numel, span).numpy()
        for c in chunks
    ]


def layout_labels(numels, chunk_size, run_seed, step, k):
    """Labels of every coordinate of a multi-tensor layout, concatenated in global order."""
    return np.concatenate(layout_chunk_labels(numels, chunk_size, run_seed, step, k))


# -- seeds ---------------------------------------------------------------------------------------
def test_derive_seed_is_stable_and_63_bit() -> None:
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    values = {derive_seed(a, b, c) for a in range(4) for b in range(4) for c in range(4)}
    assert len(values) == 64
    assert all(0 <= v < 2**63 for v in values)


def test_derive_seed_depends_on_order_and_arity() -> None:
    assert derive_seed(1, 2) != derive_seed(2, 1)
    assert derive_seed(0, 1) != derive_seed(1)
    # offsets must not collide, e.g. (seed + tensor) schemes give equal streams here
    assert derive_seed(5, 0, 1) != derive_seed(5, 1, 0)


# -- replay --------------------------------------------------------------------------------------
@given(run_seed=seeds, step=st.integers(0, 10**6), member=seeds, tensor=st.integers(0, 50))
def test_chunk_noise_replays_bit_identically(run_seed, step, member, tensor) -> None:
    a = chunk_noise(run_seed, step, member, tensor, 3, 257)
    b = chunk_noise(run_seed, step, member, tensor, 3, 257)
    assert a.dtype == NOISE_DTYPE
    assert torch.equal(a, b)


def test_chunk_noise_into_buffer_equals_fresh() -> None:
    out = torch.full((100,), 7.0)
    got = chunk_noise(1, 2, 3, 0, 0, 60, out=out)
    assert torch.equal(got, chunk_noise(1, 2, 3, 0, 0, 60))
    assert got.data_ptr() == out.data_ptr()
    assert torch.all(out[60:] == 7.0)  # only the chunk's part of the buffer is written


@pytest.mark.parametrize("field", range(5))
def test_chunk_noise_differs_for_every_seed_part(field: int) -> None:
    base = [11, 4, 99, 2, 1]
    other = list(base)
    other[field] += 1
    a = chunk_noise(*base, 5000)
    b = chunk_noise(*other, 5000)
    assert not torch.equal(a, b)
    corr = float(np.corrcoef(a.numpy(), b.numpy())[0, 1])
    assert abs(corr) < 0.06, f"noise streams are correlated (r={corr:.3f})"


def test_chunk_noise_is_standard_normal() -> None:
    eps = chunk_noise(0, 0, 0, 0, 0, 200_000).double().numpy()
    assert abs(eps.mean()) < 0.01
    assert abs(eps.std() - 1.0) < 0.01
    assert abs(np.mean(eps**4) - 3.0) < 0.1  # kurtosis of a Gaussian


def test_chunk_noise_does_not_depend_on_visiting_order() -> None:
    args = [(0, 5, 17, t, c, 33) for t in range(3) for c in range(4)]
    forward = {a: chunk_noise(*a) for a in args}
    rng = np.random.default_rng(0)
    for i in rng.permutation(len(args)):
        assert torch.equal(chunk_noise(*args[i]), forward[args[i]])


def test_space_noise_does_not_depend_on_visiting_order() -> None:
    """Walking a space's chunks in order equals regenerating each chunk alone, in any order."""
    tensors = [torch.zeros(50), torch.zeros(3, 9), torch.zeros(4)]
    space = ParameterSpace(tensors, chunk_size=8)
    p = Perturbation(run_seed=3, step=2, seed=44, scale=1.0)
    walked = [(chunk, eps.clone()) for chunk, eps in space.noise(p)]
    rng = np.random.default_rng(1)
    for i in rng.permutation(len(walked)):
        chunk, eps = walked[i]
        alone = chunk_noise(3, 2, 44, chunk.tensor_index, chunk.chunk_index, chunk.numel)
        assert torch.equal(eps, alone)


def test_noise_differs_across_tensors_and_chunks() -> None:
    """A shared seed across tensors correlates their noise: every chunk must get its own."""
    space = ParameterSpace([torch.zeros(64), torch.zeros(64), torch.zeros(8, 8)], chunk_size=16)
    p = Perturbation(run_seed=0, step=0, seed=1, scale=1.0)
    chunks = [eps.clone() for _, eps in space.noise(p)]
    assert len(chunks) == 12
    for i in range(len(chunks)):
        for j in range(i + 1, len(chunks)):
            assert not torch.equal(chunks[i], chunks[j]), (i, j)
    whole = torch.stack(chunks).double().numpy()
    corr = np.corrcoef(whole)
    off_diagonal = np.abs(corr[~np.eye(len(chunks), dtype=bool)])
    assert off_diagonal.max() < 0.9


def test_member_seeds_give_different_noise_on_a_space() -> None:
    space = VectorSpace(np.zeros(300))
    a = space.materialize(Perturbation(0, 0, 1, 1.0))
    b = space.materialize(Perturbation(0, 0, 2, 1.0))
    again = space.materialize(Perturbation(0, 0, 1, 1.0))
    assert np.array_equal(a, again)
    assert not np.array_equal(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.2


def test_noise_layout_defines_replay() -> None:
    """The same spec on the same layout replays; a different chunk size is another layout."""
    p = Perturbation(0, 1, 2, 1.0)
    a = VectorSpace(np.zeros(40), chunk_size=16).materialize(p)
    b = VectorSpace(np.zeros(40), chunk_size=16).materialize(p)
    c = VectorSpace(np.zeros(40), chunk_size=8).materialize(p)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[8:16], c[8:16])


# -- partitions ---------------------------------------------------------------------------------
partition_cases = st.tuples(
    st.lists(st.integers(1, 120), min_size=1, max_size=4),  # tensor sizes
    st.integers(1, 64),  # chunk size
    st.integers(1, 9),  # K
    seeds,
    st.integers(0, 10**6),
)


@given(partition_cases)
def test_partition_disjoint_covering_and_balanced(case) -> None:
    numels, chunk_size, k, run_seed, step = case
    per_chunk = layout_chunk_labels(numels, chunk_size, run_seed, step, k)
    labels = np.concatenate(per_chunk)
    assert labels.shape == (sum(numels),)  # one label per coordinate: disjoint
    assert labels.min() >= 0 and labels.max() < k  # every coordinate in some subspace
    for chunk in per_chunk:  # whole blocks of K hold every label once
        sizes = np.bincount(chunk, minlength=k)
        assert sizes.max() - sizes.min() <= 1, sizes
    sizes = np.bincount(labels, minlength=k)
    assert sizes.sum() == sum(numels)
    assert sizes.max() - sizes.min() <= len(per_chunk), sizes
    masks = [labels == s for s in range(k)]
    assert np.array_equal(np.sum(masks, axis=0), np.ones(sum(numels)))  # disjoint and covering


@given(partition_cases)
def test_partition_is_the_same_for_the_same_seed_and_step(case) -> None:
    numels, chunk_size, k, run_seed, step = case
    assert np.array_equal(
        layout_labels(numels, chunk_size, run_seed, step, k),
        layout_labels(numels, chunk_size, run_seed, step, k),
    )


@given(st.integers(2, 8), seeds, st.integers(0, 10**6))
def test_partition_differs_across_steps_and_seeds(k, run_seed, step) -> None:
    numels, chunk_size = [300, 77], 64
    here = layout_labels(numels, chunk_size, run_seed, step, k)
    assert not np.array_equal(here, layout_labels(numels, chunk_size, run_seed, step + 1, k))
    assert not np.array_equal(here, layout_labels(numels, chunk_size, run_seed + 1, step, k))


def test_partition_is_random_not_strided() -> None:
    """Labels are not ``index mod K`` nor contiguous blocks: each subspace spreads everywhere."""
    k, d = 4, 4000
    labels = layout_labels([d], 1 << 22, 0, 0, k)
    assert 0.2 < np.mean(labels == np.arange(d) % k) < 0.3
    for s in range(k):
        positions = np.flatnonzero(labels == s)
        # present in every tenth of the vector, roughly uniformly
        counts = np.bincount(positions * 10 // d, minlength=10)
        assert counts.min() > 0.7 * d / k / 10


def test_partition_with_one_subspace_is_everything() -> None:
    labels = layout_labels([10, 20], 7, 1, 1, 1)
    assert np.all(labels == 0)


def test_partition_stream_is_not_the_noise_stream() -> None:
    """Labels come from their own seeds: they are not a function of the member's noise."""
    labels = chunk_labels(0, 0, 2, 0, 0, 1000, 1000)
    for member in range(3):
        eps = chunk_noise(0, 0, member, 0, 0, 1000)
        agreement = np.mean((eps.numpy() > 0) == (labels.numpy() == 1))
        assert 0.4 < agreement < 0.6


@given(st.integers(2, 300), st.integers(1, 5000), seeds, st.integers(0, 10**6))
def test_step_pattern_is_blocks_of_k_written_twice(k, span, run_seed, step) -> None:
    pattern = step_pattern(run_seed, step, k, span).numpy()
    length = pattern_length(k, span)
    assert length >= span and length % k == 0 and length - span < k
    assert np.array_equal(pattern[:length], pattern[length:])
    blocks = pattern[:length].reshape(-1, k)
    assert np.array_equal(np.sort(blocks, axis=1), np.tile(np.arange(k), (len(blocks), 1)))


@given(st.integers(2, 9), st.integers(1, 3000), seeds, st.integers(0, 100), st.integers(0, 100))
def test_chunk_window_starts_on_a_block_of_the_pattern(k, span, seed, tensor, chunk) -> None:
    start = chunk_window(seed, 0, k, tensor, chunk, span)
    assert start % k == 0
    assert 0 <= start < pattern_length(k, span)


def test_chunks_read_different_windows_of_the_pattern() -> None:
    """Equal chunks of one step get unrelated labels: each its own seeded window."""
    k, numel, chunks = 4, 1000, 40
    windows = {chunk_window(7, 3, k, 0, c, numel) for c in range(chunks)}
    assert len(windows) > chunks - 3
    labels = layout_chunk_labels([numel] * 2, numel, 7, 3, k)
    assert 0.15 < np.mean(labels[0] == labels[1]) < 0.35


def test_a_steps_partition_costs_one_pattern_whatever_the_model_size() -> None:
    """The space caches one pattern per device: 2 * span labels of a byte each (K <= 256)."""
    k, span = 4, 1000
    for tensors in (4, 64):
        space = ParameterSpace([torch.zeros(span) for _ in range(tensors)], chunk_size=span)
        pattern, windows = space._partition.draw(0, 0, k, torch.device("cpu"))
        assert len(windows) == tensors
        assert pattern.numel() * pattern.element_size() == 2 * span
        assert pattern.dtype == label_dtype(k) == torch.uint8


def test_every_position_is_in_each_subspace_with_probability_one_over_k() -> None:
    """Over steps, a position's label is uniform: the marginal that the estimator relies on."""
    k, numels, chunk_size, steps = 4, [50, 30], 40, 800
    counts = np.zeros((sum(numels), k))
    for step in range(steps):
        labels = layout_labels(numels, chunk_size, 3, step, k)
        counts[np.arange(len(labels)), labels] += 1
    frequencies = counts / steps
    assert np.all(np.abs(frequencies - 1 / k) < 0.08), frequencies.min()
