"""Sharded spaces: every shard of a tensor-parallel replica holds exactly what the unsharded
space holds there, member by member and update by update (esbox.sharded)."""

from __future__ import annotations

import math
from contextlib import ExitStack

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from esbox.sharded import Block, ShardedTensorSpace, assemble_state, shard_state
from esbox.space import ParameterSpace
from esbox.specs import OptimizerSpec, Perturbation, Term, Update

SHAPES = {"embed": (10, 6), "qkv": (12, 6), "o": (6, 12), "norm": (6,), "down": (5, 7)}


def _blocks(rank: int, ranks: int) -> dict[str, Block]:
    """How a tensor-parallel worker of ``ranks`` would hold the tensors: column-parallel rows,
    row-parallel columns (uneven splits too), a replicated norm."""

    def cut(n: int) -> tuple[int, int]:
        edges = [round(i * n / ranks) for i in range(ranks + 1)]
        return edges[rank], edges[rank + 1]

    return {
        "embed": Block.of_rows(SHAPES["embed"], *cut(10)),
        "qkv": Block.of_rows(SHAPES["qkv"], *cut(12)),
        "o": Block.of_columns(SHAPES["o"], *cut(12)),
        "norm": Block.whole(SHAPES["norm"]),
        "down": Block.of_columns(SHAPES["down"], *cut(7)),
    }


def _logical(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return {
        name: torch.randn(shape, generator=generator).to(dtype) for name, shape in SHAPES.items()
    }


def _spaces(ranks: int, dtype: torch.dtype, **options):
    logical = _logical(dtype)
    reference = ParameterSpace([t.clone() for t in logical.values()], **options)
    shards = []
    for rank in range(ranks):
        blocks = _blocks(rank, ranks)
        shards.append(
            ShardedTensorSpace(
                [(n, blocks[n].of(t).clone(), blocks[n]) for n, t in logical.items()], **options
            )
        )
    return reference, shards


def _check_equal(reference: ParameterSpace, shards: list[ShardedTensorSpace]) -> None:
    for shard in shards:
        for i, (block, flat) in enumerate(zip(shard.blocks, shard._flat, strict=True)):
            assert torch.equal(block.of(reference._flat[i]), flat), shard.names[i]


MEMBERS = [
    Perturbation(seed=3, scale=0.1, run_seed=5, step=2),
    Perturbation(seed=3, scale=-0.1, run_seed=5, step=2),
    Perturbation(seed=9, scale=0.2, run_seed=5, step=2, subspace=1, num_subspaces=3),
    Perturbation(seed=4, scale=0.05, run_seed=5, step=2, diagonal=True),
]


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "options",
    [
        {"chunk_size": 7},  # chunks cut rows anywhere
        {"chunk_size": 24},
        {"chunk_size": 5, "noise": "table", "table_size": 1000},
        {"chunk_size": 9, "reflect_antithetic": True},
    ],
    ids=["chunk7", "chunk24", "table", "reflect"],
)
def test_shards_follow_the_unsharded_space(ranks, dtype, options):
    reference, shards = _spaces(ranks, dtype, **options)
    assert {s.dimension for s in shards} == {reference.dimension}
    with ExitStack() as stack:
        expected = stack.enter_context(reference.sweep(MEMBERS))
        walks = [stack.enter_context(shard.sweep(MEMBERS)) for shard in shards]
        for member in expected:
            for walk in walks:
                assert next(walk) == member
            _check_equal(reference, shards)
    _check_equal(reference, shards)  # restored exactly
    updates = [
        Update(
            run_seed=5,
            step=2,
            learning_rate=0.3,
            terms=(Term(3, 0.5), Term(9, -0.25, subspace=1, num_subspaces=3)),
        ),
        Update(
            run_seed=5,
            step=3,
            learning_rate=0.1,
            terms=(Term(4, 1.0), Term(8, -0.5)),
            optimizer=OptimizerSpec(name="adam", weight_decay=0.01),
            scale_terms=(Term(4, 0.2),),
        ),
        Update(run_seed=5, step=4, learning_rate=0.2, terms=(Term(1, 1.0),), diagonal=True),
    ]
    for update in updates:
        norm = reference.apply(update)
        for shard in shards:
            shard.apply(update)
        _check_equal(reference, shards)
        seen: set[tuple[int, Block]] = set()
        total = 0.0
        for shard in shards:
            for i, block in enumerate(shard.blocks):
                if (i, block) not in seen:
                    seen.add((i, block))
                    total += shard.update_squares[i]
        assert math.isclose(math.sqrt(total), norm, rel_tol=1e-9)
    state = assemble_state([s.state_dict() for s in shards], [s.blocks for s in shards])
    assert state.keys() == reference.state_dict().keys()
    for key, value in reference.state_dict().items():
        assert torch.equal(state[key], value), key


def test_explicit_members_and_shifts_are_sharded_too():
    reference, shards = _spaces(2, torch.float64, chunk_size=8)
    values = torch.linspace(-1, 1, reference.dimension, dtype=torch.float64).tolist()
    member = Perturbation(run_seed=0, step=0, seed=0, scale=1.0, values=tuple(values))
    with reference.perturbed(member):
        for shard in shards:
            with shard.perturbed(member):
                for i, block in enumerate(shard.blocks):
                    assert torch.equal(block.of(reference._flat[i]), shard._flat[i])
    reference.apply(Update(run_seed=0, step=0, terms=(), learning_rate=0.0, shift=tuple(values)))
    for shard in shards:
        shard.apply(Update(run_seed=0, step=0, terms=(), learning_rate=0.0, shift=tuple(values)))
    _check_equal(reference, shards)
    with pytest.raises(ValueError, match="values for a space of"):
        shards[0].apply(Update(run_seed=0, step=0, terms=(), learning_rate=0.0, shift=(1.0,)))


def test_a_state_dict_round_trips_through_the_shards():
    reference, shards = _spaces(3, torch.bfloat16, chunk_size=11)
    reference.apply(Update(run_seed=1, step=0, learning_rate=0.5, terms=(Term(2, 1.0),)))
    logical = reference.state_dict()
    for shard in shards:
        shard.load_state_dict(shard_state(logical, shard.blocks))
    _check_equal(reference, shards)
    assembled = assemble_state([s.state_dict() for s in shards], [s.blocks for s in shards])
    assert all(torch.equal(assembled[k], v) for k, v in logical.items())


def test_shards_that_miss_part_of_a_tensor_are_refused_on_assembly():
    _, shards = _spaces(2, torch.float32)
    with pytest.raises(ValueError, match="do not cover"):
        assemble_state([shards[0].state_dict()], [shards[0].blocks])


def test_a_shard_draws_only_the_chunks_it_meets():
    _, shards = _spaces(2, torch.float32, chunk_size=6)  # one row a chunk
    embed = [c for c in shards[0].chunks if c.tensor_index == 0]
    assert [c.chunk_index for c in embed] == [0, 1, 2, 3, 4]  # rows 0-4 of 10


def test_a_shard_must_fill_its_block():
    with pytest.raises(ValueError, match="shard of 5 elements"):
        ShardedTensorSpace([("w", torch.zeros(5), Block.of_rows((4, 3), 0, 2))])
    with pytest.raises(ValueError, match="rows"):
        Block.of_rows((4, 3), 2, 6)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 7),
    data=st.data(),
)
def test_take_gathers_the_blocks_elements_in_order(rows, cols, data):
    r0 = data.draw(st.integers(0, rows - 1))
    r1 = data.draw(st.integers(r0 + 1, rows))
    c0 = data.draw(st.integers(0, cols - 1))
    c1 = data.draw(st.integers(c0 + 1, cols))
    block = Block(rows, cols, r0, r1, c0, c1)
    start = data.draw(st.integers(0, rows * cols - 1))
    stop = data.draw(st.integers(start + 1, rows * cols))
    logical = torch.arange(rows * cols, dtype=torch.float32)
    inside = block.of(logical)  # the block's logical indices, in order
    expected = inside[(inside >= start) & (inside < stop)]
    taken = block.take(logical[start:stop], start)
    assert torch.equal(taken, expected)
    low, high = block.local_range(start, stop)
    assert torch.equal(inside[low:high], expected)
