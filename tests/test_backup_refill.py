"""After the parameters move (an update, an explicit shift, a low-rank update, a load), the next
sweep writes its members from, and restores to, the moved parameters: the exact backup is
refilled, never the values from before the move (that would silently undo every update).

Each space fills its backup in a first sweep, then moves twice with a sweep after each move;
the members of every sweep are compared with those of a fresh space loaded with the moved state
(a backup that has never been filled), and the parameters after it with the moved ones.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from esbox.adapters.models.space import TorchModuleSpace
from esbox.sharded import Block, ShardedTensorSpace
from esbox.space import ParameterSpace, VectorSpace
from esbox.specs import OptimizerSpec, Perturbation, Term, Update

CHUNK = 7  # several chunks a tensor, chunks across tensor boundaries


def module(dtype: torch.dtype, norm_dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(5, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 3, bias=False)
    )
    net.to(dtype)
    net[1].to(norm_dtype)
    return net


def sharded() -> ShardedTensorSpace:
    """Rank 0 of 2 tensor-parallel workers: rows of one weight, columns of another, a whole
    vector."""
    generator = torch.Generator().manual_seed(1)
    logical = {"qkv": (8, 5), "o": (5, 8), "norm": (5,)}
    blocks = {
        "qkv": Block.of_rows(logical["qkv"], 0, 4),
        "o": Block.of_columns(logical["o"], 0, 3),
        "norm": Block.whole(logical["norm"]),
    }
    shards = [
        (name, blocks[name].of(torch.randn(shape, generator=generator)).clone(), blocks[name])
        for name, shape in logical.items()
    ]
    return ShardedTensorSpace(shards, chunk_size=CHUNK)


SPACES: dict[str, Callable[[], ParameterSpace]] = {
    "vector-float64": lambda: VectorSpace(np.linspace(-1, 1, 23), chunk_size=CHUNK),
    "vector-float32": lambda: VectorSpace(np.linspace(-1, 1, 23), dtype="float32", chunk_size=5),
    # fp32 weights: the backup holds every tensor
    "module-fp32": lambda: TorchModuleSpace(module(torch.float32, torch.float32), chunk_size=CHUNK),
    # bf16 weights: fp32 masters are the reference, the backup holds nothing
    "module-bf16": lambda: TorchModuleSpace(
        module(torch.bfloat16, torch.bfloat16), chunk_size=CHUNK
    ),
    # bf16 weights beside an fp32 norm: masters and backup in one space
    "module-bf16-fp32-norm": lambda: TorchModuleSpace(
        module(torch.bfloat16, torch.float32), chunk_size=CHUNK
    ),
    "sharded": sharded,
}
MODULES = [name for name in SPACES if name.startswith("module")]


def sgd(step: int) -> Update:
    terms = (Term(seed=11 + step, coefficient=1.0), Term(seed=12 + step, coefficient=-0.5))
    return Update(run_seed=3, step=step, terms=terms, learning_rate=0.2)


def adam_in_subspaces(step: int) -> Update:
    terms = tuple(Term(seed=20 + s, coefficient=1.0, subspace=s, num_subspaces=2) for s in (0, 1))
    return Update(3, step, terms, 0.05, OptimizerSpec("adam"))


def shift(space: ParameterSpace, step: int) -> Update:
    values = tuple(0.1 * (step + 1) * np.cos(np.arange(space.dimension)))
    return Update(3, step, (), 0.0, shift=values)


def low_rank(step: int) -> Update:
    return Update(3, step, (Term(seed=31 + step, coefficient=1.0),), 0.2, rank=2)


def load(space: ParameterSpace, build: Callable[[], ParameterSpace], step: int) -> None:
    """Load the state of another space of the same layout, moved elsewhere."""
    other = build()
    other.apply(Update(9, step, (Term(seed=40 + step, coefficient=1.0),), 0.3))
    space.load_state_dict(other.state_dict())


MOVES: dict[str, Callable[[ParameterSpace, Callable[[], ParameterSpace], int], object]] = {
    "update": lambda space, build, step: space.apply(sgd(step)),
    "adam-subspaces": lambda space, build, step: space.apply(adam_in_subspaces(step)),
    "shift": lambda space, build, step: space.apply(shift(space, step)),
    "low-rank": lambda space, build, step: space.apply(low_rank(step)),
    "load": load,
}
CASES = [(s, m) for s in SPACES for m in MOVES if m != "low-rank" or s in MODULES]


def members(space: ParameterSpace, step: int) -> list[Perturbation]:
    """An antithetic pair, a subspace member and an explicit one (all written from the
    reference)."""
    pair = [Perturbation(run_seed=3, step=step, seed=5, scale=s) for s in (0.1, -0.1)]
    subspace = Perturbation(3, step, seed=6, scale=0.2, subspace=1, num_subspaces=2)
    values = tuple(0.05 * np.sin(np.arange(space.dimension) + step))
    return [*pair, subspace, Perturbation(3, step, seed=7, scale=1.0, values=values)]


def weights(space: ParameterSpace) -> list[torch.Tensor]:
    return [t.clone() for t in space._flat]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def sweep(space: ParameterSpace, step: int) -> list[list[torch.Tensor]]:
    """The parameters at each member of a sweep."""
    with space.sweep(members(space, step)) as held:
        return [weights(space) for _ in held]


@pytest.mark.parametrize(("space_name", "move"), CASES)
def test_the_sweep_after_a_move_starts_and_ends_at_the_moved_parameters(space_name, move):
    build = SPACES[space_name]
    space = build()
    sweep(space, 0)  # the backup is filled here, before any move
    for step in (1, 2):
        before = weights(space)
        MOVES[move](space, build, step)
        moved = weights(space)
        assert not same(moved, before), "the move changed nothing: the test would prove nothing"
        fresh = build()
        fresh.load_state_dict(space.state_dict())  # the moved state, a backup never filled
        seen, expected = sweep(space, step), sweep(fresh, step)
        for index, (got, want) in enumerate(zip(seen, expected, strict=True)):
            assert same(got, want), f"step {step}: member {index} is not the moved one's"
        assert same(weights(space), moved), f"step {step}: the sweep restored the old weights"
