"""Low-rank (EGGROLL-style) noise: the factor maths, a model space realising it, the strategies.

Replay (same spec, same factors), members equal to ``W + s A B^T / sqrt(r)`` written by hand,
exact restore, updates equal to the explicit sum of factor products, bf16 through the master,
CoPES subsets of matrices (disjoint, covering, K = 1 is OpenAI-ES) and a bit-identical resume.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

import esbox  # noqa: E402
from esbox.adapters.models.space import TorchModuleSpace  # noqa: E402
from esbox.adapters.models.testing import tiny_causal_lm  # noqa: E402
from esbox.cli.main import cli  # noqa: E402
from esbox.errors import ConfigError  # noqa: E402
from esbox.lowrank import factors, matrix_labels, row_blocks, spec_rank, stacked_factors  # noqa: E402
from esbox.space import VectorSpace  # noqa: E402
from esbox.specs import Perturbation, Term, Update  # noqa: E402


def tiny(dtype=torch.float32, tie: bool = True, seed: int = 0):
    model = tiny_causal_lm(vocab_size=40, seed=seed, tie_word_embeddings=tie)
    return model.to(dtype).requires_grad_(False)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def explicit_noise(space, p: Perturbation, i: int) -> torch.Tensor:
    """Member ``p``'s noise on matrix ``i`` written out: ``scale A B^T / sqrt(r)``."""
    a, b = factors(p.run_seed, p.step, p.seed, i, space.shapes[i], p.rank)
    return (a @ b.T) * (p.scale / math.sqrt(p.rank))


def strategy(space, name="openai_es", **options):
    base = {"population": 8, "sigma": 0.05, "learning_rate": 0.01, "perturbation": "lowrank"}
    base["rank"] = 2
    return esbox.make_strategy(name, space, seed=3, **{**base, **options})


# -- the maths --------------------------------------------------------------------------------
def test_factors_replay_and_differ_across_seeds_tensors_and_steps():
    a, b = factors(1, 2, 3, 4, (30, 20), 5)
    again = factors(1, 2, 3, 4, (30, 20), 5)
    assert a.shape == (30, 5) and b.shape == (20, 5) and a.dtype == torch.float32
    assert torch.equal(a, again[0]) and torch.equal(b, again[1])
    for other in [(1, 2, 9, 4), (1, 2, 3, 5), (1, 7, 3, 4), (8, 2, 3, 4)]:
        assert not torch.equal(factors(*other, (30, 20), 5)[0], a)


def test_lowrank_entries_have_unit_variance_like_full_rank_noise():
    pairs = [factors(0, 0, seed, 0, (64, 48), 4) for seed in range(50)]
    values = torch.stack([a @ b.T / math.sqrt(4) for a, b in pairs])
    assert abs(float(values.var()) - 1.0) < 0.05
    assert abs(float(values.mean())) < 0.02


def test_stacked_factors_equal_the_explicit_weighted_sum():
    pairs = [(5, 0.7), (6, -1.3), (9, 0.25)]
    a_cat, b_cat = stacked_factors(1, 2, pairs, 3, (17, 11), 3)
    assert a_cat.shape == (17, 9) and b_cat.shape == (11, 9)
    explicit = sum(c * (lambda a, b: a @ b.T)(*factors(1, 2, s, 3, (17, 11), 3)) for s, c in pairs)
    torch.testing.assert_close(a_cat @ b_cat.T, explicit / math.sqrt(3))


def test_row_blocks_cover_the_rows_within_budget():
    assert list(row_blocks(10, 4, 12)) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert list(row_blocks(3, 100, 10)) == [(0, 1), (1, 2), (2, 3)]  # at least one row


@pytest.mark.parametrize("k,count", [(1, 5), (3, 10), (4, 4), (2, 15)])
def test_matrix_labels_are_balanced_seeded_and_new_each_step(k, count):
    labels = matrix_labels(0, 5, k, count)
    sizes = np.bincount(labels, minlength=k)
    assert len(labels) == count and sizes.sum() == count and sizes.max() - sizes.min() <= 1
    assert matrix_labels(0, 5, k, count) == labels
    if k > 1:
        assert any(matrix_labels(0, s, k, count) != labels for s in range(6, 10))


def test_spec_rank_reads_the_options():
    assert spec_rank(type("O", (), {"perturbation": "lowrank", "rank": 3})()) == 3
    assert spec_rank(type("O", (), {"perturbation": "full", "rank": 3})()) == 0
    assert spec_rank(object()) == 0  # strategies without the option draw full-rank noise


# -- members on a model -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_member_is_w_plus_scaled_factor_product_and_restores_exactly(dtype):
    model = tiny(dtype)
    space = TorchModuleSpace(model, chunk_size=100)  # row blocks of a few rows
    before = snapshot(model)
    p = Perturbation(7, 1, 42, -0.3, rank=3)
    with space.perturbed(p):
        for i, (name, param) in enumerate(zip(space.names, space._flat, strict=True)):
            ref = before[name]
            if len(space.shapes[i]) == 1:
                assert torch.equal(param.view_as(ref), ref), f"vector {name} must stay frozen"
                continue
            expected = (ref.float() + explicit_noise(space, p, i)).to(dtype)
            tol = 1e-6 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(param.view_as(ref), expected, atol=tol, rtol=tol)
    assert same(before, snapshot(model))
    with pytest.raises(RuntimeError, match="boom"), space.perturbed(p):
        raise RuntimeError("boom")
    assert same(before, snapshot(model))


def test_noise_yields_the_member_displacement_chunk_by_chunk():
    space = TorchModuleSpace(tiny(), chunk_size=50)  # chunks cut rows
    p = Perturbation(1, 0, 9, 0.5, rank=2)
    flat = torch.cat([eps for _, eps in space.noise(p)])
    expected = torch.cat(
        [
            explicit_noise(space, p, i).reshape(-1)
            if len(shape) == 2
            else torch.zeros(math.prod(shape))
            for i, shape in enumerate(space.shapes)
        ]
    )
    torch.testing.assert_close(flat, expected)


def test_antithetic_reflection_realises_the_twin():
    model = tiny()
    space = TorchModuleSpace(model, reflect_antithetic=True)
    plus, minus = Perturbation(1, 0, 5, 0.2, rank=2), Perturbation(1, 0, 5, -0.2, rank=2)
    with space.sweep([plus, minus]) as members:
        next(members)
        next(members)
        reflected = snapshot(model)
    with space.perturbed(minus):
        torch.testing.assert_close(snapshot(model), reflected)


# -- updates ------------------------------------------------------------------------------------
def test_update_equals_learning_rate_times_explicit_sum_and_skips_vectors():
    model = tiny()
    space = TorchModuleSpace(model, chunk_size=64)
    before = snapshot(model)
    terms = (Term(11, 0.5), Term(12, -2.0), Term(13, 1.25))
    norm = space.apply(Update(4, 2, terms, 0.1, rank=3))
    squared = 0.0
    for i, name in enumerate(space.names):
        moved = space._flat[i].view_as(before[name]) - before[name]
        if len(space.shapes[i]) == 1:
            assert torch.equal(moved, torch.zeros_like(moved))
            continue
        grad = sum(
            t.coefficient * explicit_noise(space, Perturbation(4, 2, t.seed, 1.0, rank=3), i)
            for t in terms
        )
        torch.testing.assert_close(moved, 0.1 * grad, atol=1e-6, rtol=1e-4)
        squared += float((0.1 * grad).double().pow(2).sum())
    assert norm == pytest.approx(math.sqrt(squared), rel=1e-5)


def test_bf16_updates_go_through_the_fp32_master():
    model = tiny(torch.bfloat16)
    space = TorchModuleSpace(model)
    q = space.names.index("model.layers.0.self_attn.q_proj.weight")
    start = space._master[q].clone()
    for step in range(5):
        space.apply(Update(0, step, (Term(step, 1.0),), 1e-5, rank=2))
    master = space._master[q]
    assert float((master - start).abs().max()) > 0, "tiny steps must accumulate in the master"
    assert torch.equal(space._flat[q], master.to(torch.bfloat16))


def test_adam_and_weight_decay_follow_the_replayed_low_rank_gradient():
    model = tiny()
    space = TorchModuleSpace(model)
    es = strategy(space, optimizer="adam", weight_decay=0.1)
    for _ in range(2):
        members = es.ask()
        update = es.tell(np.arange(len(members), dtype=float))
        assert update.rank == 2 and space.apply(update) > 0


def test_replicas_applying_the_same_updates_stay_bit_identical():
    one, two = tiny(), tiny()
    spaces = [TorchModuleSpace(one, chunk_size=64), TorchModuleSpace(two, chunk_size=64)]
    es = strategy(spaces[0], "copes", subspaces=2, antithetic=False)
    for _ in range(3):
        es.ask()
        update = es.tell(np.random.default_rng(0).normal(size=8))
        for space in spaces:
            space.apply(Update.from_dict(update.to_dict()))  # through the wire format
    assert same(snapshot(one), snapshot(two))


# -- strategies ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["openai_es", "esopt", "copes"])
def test_strategies_carry_the_rank_on_members_and_updates(name):
    space = TorchModuleSpace(tiny())
    options = {"subspaces": 2} if name == "copes" else {}
    es = strategy(space, name, rank=5, **options)
    members = es.ask()
    assert {p.rank for p in members} == {5}
    assert es.tell(np.arange(8.0)).rank == 5
    full = strategy(space, name, perturbation="full", **options)
    assert {p.rank for p in full.ask()} == {0} and full.tell(np.arange(8.0)).rank == 0
    assert "rank" not in full.ask()[0].to_dict()  # full-rank specs keep their wire format
    assert Perturbation(**members[0].to_dict()) == members[0]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"perturbation": "low-rank"}, "'perturbation' is 'low-rank'.*allowed: full, lowrank"),
        ({"rank": 0}, "'rank' must be >= 1"),
    ],
)
def test_bad_perturbation_options_name_the_key_and_the_allowed_values(options, message):
    with pytest.raises(ConfigError, match=message):
        esbox.make_strategy("openai_es", VectorSpace(np.zeros(4)), **options)


def test_copes_k1_low_rank_equals_openai_es_low_rank():
    spaces = [TorchModuleSpace(tiny()), TorchModuleSpace(tiny())]
    copes = strategy(spaces[0], "copes", subspaces=1, shaping="centered_ranks")
    plain = strategy(spaces[1], "openai_es")
    for _ in range(2):
        assert copes.ask() == plain.ask()
        rewards = np.random.default_rng(1).normal(size=8)
        updates = copes.tell(rewards), plain.tell(rewards)
        assert updates[0] == updates[1]
        for space, update in zip(spaces, updates, strict=True):
            space.apply(update)
    assert same(snapshot(spaces[0].module), snapshot(spaces[1].module))


def test_copes_low_rank_subspaces_are_disjoint_covering_sets_of_matrices():
    model = tiny()
    space = TorchModuleSpace(model)
    es = strategy(space, "copes", subspaces=3, antithetic=False, population=6)
    members = es.ask()
    before = snapshot(model)
    moved_by: dict[int, set[str]] = {}
    for p in members:
        with space.perturbed(p):
            now = snapshot(model)
            moved = {k for k in now if not torch.equal(now[k], before[k])}
        moved_by.setdefault(p.subspace, set()).update(moved)
        # a member moves exactly its subset of whole matrices
        subset = {space.names[i] for i in space.lowrank_tensors(p, p.run_seed, p.step)}
        assert moved == subset
    sets = list(moved_by.values())
    assert all(a.isdisjoint(b) for j, a in enumerate(sets) for b in sets[j + 1 :])
    assert set().union(*sets) == {space.names[i] for i in space.matrices}
    # an update made of subspace 1's terms touches subspace 1's matrices only
    update = es.tell(np.arange(6.0))
    only = Update(update.run_seed, update.step, tuple(t for t in update.terms if t.subspace == 1),
                  update.learning_rate, rank=update.rank)  # fmt: skip
    space.apply(only)
    now = snapshot(model)
    assert {k for k in now if not torch.equal(now[k], before[k])} == moved_by[1]


def test_more_subspaces_than_matrices_is_refused_naming_the_bound():
    space = TorchModuleSpace(tiny(), include=["*.q_proj.weight"])  # 2 matrices
    es = strategy(space, "copes", subspaces=4, antithetic=False)
    member = es.ask()[0]
    with pytest.raises(ConfigError, match="subspaces must be at most 2"), space.perturbed(member):
        pass


def test_low_rank_needs_matrices():
    space = TorchModuleSpace(tiny(), include=["*norm.weight"])
    member = Perturbation(0, 0, 1, 0.1, rank=2)
    with pytest.raises(ConfigError, match="needs 2-D weights"), space.perturbed(member):
        pass
    with pytest.raises(ConfigError, match="perturbation 'lowrank' needs weight matrices"):
        VectorSpace(np.zeros(3)).apply(Update(0, 0, (Term(1, 1.0),), 0.1, rank=2))


def test_a_low_rank_strategy_on_a_vector_is_refused_before_its_first_step(tmp_path):
    with pytest.raises(ConfigError, match="perturbation 'lowrank' needs weight matrices"):
        esbox.make_strategy("openai_es", VectorSpace(np.zeros(3)), perturbation="lowrank")
    config = tmp_path / "run.yaml"
    config.write_text(
        "strategy: copes\noptions: {perturbation: lowrank}\n"
        "problem: {kind: function, name: sphere, dimension: 8}\nbudget: {max_steps: 3}\n"
    )
    result = CliRunner().invoke(cli, ["optimize", "-q", "--config", str(config), "--out",
                                      str(tmp_path / "run")])  # fmt: skip
    assert result.exit_code == 2 and "perturbation 'lowrank'" in result.output
    assert not (tmp_path / "run" / "metrics.jsonl").exists(), "refused before any step"


def test_resume_of_a_low_rank_run_is_bit_identical(tmp_path):
    def run(steps: int, directory: str, resume=None):
        model = tiny()
        space = TorchModuleSpace(model, chunk_size=300)
        es = strategy(space, "copes", subspaces=2, optimizer="adam")

        def reward(space_, members):
            out = []
            with space_.sweep(members) as each:
                for _ in each:
                    out.append(float(model.lm_head.weight.sum()))
            return np.array(out)

        evaluator = type("E", (), {"evaluate": staticmethod(reward)})()
        runner = esbox.Runner(
            space, es, evaluator, esbox.Budget(max_steps=steps),
            checkpoint_dir=tmp_path / directory, checkpoint_every=1,
        )  # fmt: skip
        if resume:
            runner.resume(resume)
        runner.run()
        return snapshot(model)

    full = run(4, "full")
    run(2, "interrupted")
    assert same(full, run(4, "resumed", resume=tmp_path / "interrupted"))
