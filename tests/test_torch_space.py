"""TorchModuleSpace on tiny random Llama/Qwen2 models: restore, replay, precision, ties, resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import esbox  # noqa: E402
from esbox.adapters.models.space import TorchModuleSpace  # noqa: E402
from esbox.adapters.models.testing import tiny_causal_lm  # noqa: E402
from esbox.adapters.tasks import ArithmeticTask  # noqa: E402
from esbox.adapters.tasks.rollouts import RolloutEvaluator  # noqa: E402
from esbox.noise import chunk_noise  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def tiny_model(arch: str = "llama", dtype=torch.float32, seed: int = 0, tie: bool = True):
    model = tiny_causal_lm(arch, vocab_size=64, seed=seed, tie_word_embeddings=tie)
    return model.to(dtype).requires_grad_(False)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def population(space, name="copes", seed=3, **options):
    defaults = {"population": 8, "sigma": 0.01, "learning_rate": 1e-3}
    if name == "copes":
        defaults["subspaces"] = 2
    return esbox.make_strategy(name, space, seed=seed, **{**defaults, **options})


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_exact_restore_after_perturbation_and_after_exception(arch, dtype):
    model = tiny_model(arch, dtype)
    space = TorchModuleSpace(model, chunk_size=700)
    before = snapshot(model)
    perturbation = population(space).ask()[0]
    with space.perturbed(perturbation):
        assert not same(before, snapshot(model)), "the perturbation must change the weights"
    assert same(before, snapshot(model))
    with pytest.raises(RuntimeError, match="boom"), space.perturbed(perturbation):
        raise RuntimeError("boom")
    assert same(before, snapshot(model))


def test_tied_embeddings_are_one_tensor_perturbed_once():
    model = tiny_model(tie=True)
    space = TorchModuleSpace(model)
    assert "lm_head.weight" not in space.names and "model.embed_tokens.weight" in space.names
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    untied = TorchModuleSpace(tiny_model(tie=False))
    embed = model.model.embed_tokens.weight.numel()
    assert untied.dimension == space.dimension + embed
    before = model.model.embed_tokens.weight.clone()
    with space.perturbed(population(space, "openai_es").ask()[0]):
        delta = model.model.embed_tokens.weight - before
        # perturbed once: the shared tensor moved by sigma * eps, not 2 sigma * eps
        assert 0.005 < float(delta.std()) < 0.02


def test_include_exclude_patterns_select_a_subset():
    model = tiny_model()
    space = TorchModuleSpace(model, include=["*.self_attn.*", "*.mlp.*"], exclude=["*.o_proj.*"])
    assert space.names and all((".self_attn." in n or ".mlp." in n) for n in space.names)
    assert not any("o_proj" in n for n in space.names)
    frozen = {k: v.clone() for k, v in model.state_dict().items() if "norm" in k or "embed" in k}
    es = population(space)
    es.ask()
    space.apply(es.tell(np.arange(8.0)))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in frozen.items())
    with pytest.raises(ValueError, match="no parameter matches"):
        TorchModuleSpace(model, include=["nothing.*"])


def test_noise_differs_across_tensors_and_chunks():
    model = tiny_model()
    space = TorchModuleSpace(model, chunk_size=256)
    p = population(space, "openai_es").ask()[0]
    chunks = [eps.clone() for _, eps in space.noise(p)]
    assert len(chunks) > len(space.names)
    heads = torch.stack([c[:64] for c in chunks if c.numel() >= 64])
    corr = torch.corrcoef(heads)
    off_diagonal = corr[~torch.eye(len(heads), dtype=torch.bool)]
    assert float(off_diagonal.abs().max()) < 0.6
    assert len({tuple(c[:8].tolist()) for c in chunks}) == len(chunks)
    first = space.chunks[0]
    direct = chunk_noise(
        p.run_seed, p.step, p.seed, first.tensor_index, first.chunk_index, first.numel
    )
    assert torch.equal(direct * p.scale, chunks[0])


def test_copes_partition_over_model_parameters_is_disjoint_and_covering():
    model = tiny_model()
    space = TorchModuleSpace(model, include=["*.mlp.*"], chunk_size=500)
    es = population(space, subspaces=4, population=8, antithetic=False)
    members = es.ask()
    masks = []
    for k in range(4):
        p = next(m for m in members if m.subspace == k)
        masks.append(torch.cat([(eps != 0) for _, eps in space.noise(p)]))
    stacked = torch.stack(masks).int()
    assert int(stacked.sum(0).max()) == 1, "subspaces overlap"
    assert int(stacked.sum()) == space.dimension, "subspaces do not cover the chosen subset"
    for chunk in torch.split(stacked, [c.numel for c in space.chunks], dim=1):
        sizes = chunk.sum(1)  # balanced within every chunk
        assert int(sizes.max() - sizes.min()) <= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_update_replay_on_two_replicas_is_bit_identical(dtype):
    a, b = tiny_model(dtype=dtype), tiny_model(dtype=dtype)
    space_a, space_b = TorchModuleSpace(a, chunk_size=900), TorchModuleSpace(b, chunk_size=900)
    es = population(space_a, optimizer="adam")
    for step in range(3):
        es.ask()
        update = es.tell(np.sin(np.arange(8.0) + step))
        wire = esbox.Update.from_dict(update.to_dict())
        space_a.apply(update)
        space_b.apply(wire)
    assert same(snapshot(a), snapshot(b))


def test_small_updates_to_bf16_weights_are_not_rounded_away():
    model = tiny_model(dtype=torch.bfloat16)
    space = TorchModuleSpace(model)
    norm = model.model.norm.weight  # all ones in bf16: spacing 2**-7 around 1
    es = population(space, "openai_es", learning_rate=1e-6, sigma=0.01)
    for step in range(40):
        es.ask()
        space.apply(es.tell(np.cos(np.arange(8.0) * (step + 1))))
    index = space.names.index("model.norm.weight")
    master = space._master[index]
    drift = (master - 1.0).abs().max()
    assert float(drift) > 0, "the fp32 master must accumulate the tiny updates"
    # naive bf16 accumulation of the same updates would have stayed exactly at 1.0
    assert torch.equal(norm, master.to(torch.bfloat16).view_as(norm))


class FakeBackend:
    """Answers every arithmetic question with the model's first logit sign (deterministic)."""

    def __init__(self, model):
        self.model = model

    def generate(
        self,
        prompts,
        *,
        prefills=None,
        max_new_tokens=4,
        greedy=True,
        seed=None,
        stop=None,
        num_samples=1,
        **_,
    ):
        with torch.inference_mode():
            logits = self.model(torch.arange(8).unsqueeze(0)).logits.float()
        value = float(logits[0, -1, 0])
        return [str(int(abs(value) * 1000) % 200) for _ in prompts]


class BrokenRewardTask(ArithmeticTask):
    def reward(self, completion, example):
        if int(completion) % 3 == 0:
            raise ValueError("reward crashed")
        return float("nan") if int(completion) % 3 == 1 else 1.0


def test_reward_that_raises_or_returns_nan_scores_nan_and_is_counted():
    model = tiny_model()
    space = TorchModuleSpace(model)
    task = BrokenRewardTask(train_size=50, heldout_size=10)
    evaluator = RolloutEvaluator(task, FakeBackend(model), batch_size=4)
    es = population(space, "openai_es", population=16, sigma=0.05)
    before = snapshot(model)
    rewards = evaluator.evaluate(space, es.ask())
    assert same(before, snapshot(model))
    assert np.isnan(rewards).any()
    update = es.tell(rewards)
    assert es.metrics["nonfinite_rewards"] == int(np.isnan(rewards).sum())
    assert all(math.isfinite(t.coefficient) for t in update.terms)


def test_resume_is_bit_identical(tmp_path):
    def run(steps, directory, resume=None):
        model = tiny_model()
        space = TorchModuleSpace(model, chunk_size=1000)
        es = population(space, optimizer="adam")
        evaluator = RolloutEvaluator(
            ArithmeticTask(train_size=50, heldout_size=10), FakeBackend(model), batch_size=2
        )
        runner = esbox.Runner(
            space,
            es,
            evaluator,
            esbox.Budget(max_steps=steps),
            checkpoint_dir=tmp_path / directory,
            checkpoint_every=1,
        )
        if resume:
            runner.resume(resume)
        runner.run()
        return snapshot(model), runner.history

    full, history = run(4, "full")
    run(2, "interrupted")  # stops after step 2, as an interrupted run would
    resumed, resumed_history = run(4, "resumed", resume=tmp_path / "interrupted")
    assert same(full, resumed)
    assert [h["reward_mean"] for h in history] == [h["reward_mean"] for h in resumed_history]


def test_noise_table_mode_restores_replays_and_keeps_members_apart(tmp_path):
    model, twin = tiny_model(), tiny_model()
    space = TorchModuleSpace(model, chunk_size=500, noise="table", table_size=4096)
    replica = TorchModuleSpace(twin, chunk_size=500, noise="table", table_size=4096)
    before = snapshot(model)
    es = population(space, subspaces=2, population=8, antithetic=False)
    members = es.ask()
    first = torch.cat([eps.clone() for _, eps in space.noise(members[0])])
    with pytest.raises(RuntimeError, match="boom"), space.perturbed(members[0]):
        raise RuntimeError("boom")
    assert same(before, snapshot(model))
    other = torch.cat([eps.clone() for _, eps in space.noise(members[2])])  # same subspace
    assert not torch.equal(first, other)
    masks = [torch.cat([eps != 0 for _, eps in space.noise(p)]) for p in members[::4]]
    assert not (masks[0] & masks[1]).any(), "subspaces overlap in table mode"
    update = es.tell(np.arange(8.0))
    space.apply(update)
    replica.apply(esbox.Update.from_dict(update.to_dict()))
    assert same(snapshot(model), snapshot(twin))
    generator_space = TorchModuleSpace(tiny_model(), chunk_size=500)
    with pytest.raises(esbox.ResumeError, match="noise table"):
        generator_space.load_state_dict(space.state_dict())
    with pytest.raises(ValueError, match="exceeds the noise table"):
        TorchModuleSpace(model, chunk_size=5000, noise="table", table_size=1000)


def test_noise_table_is_never_written_by_unmasked_perturbations_and_updates():
    model = tiny_model()
    space = TorchModuleSpace(model, chunk_size=500, noise="table", table_size=4096)
    es = population(space, "openai_es", population=4)
    members = es.ask()
    with space.perturbed(members[0]):
        pass
    table = space._filler.table._tables[torch.device("cpu")]
    before = table.clone()
    for p in members:
        with space.perturbed(p):
            pass
    space.apply(es.tell(np.arange(4.0)))
    assert torch.equal(table, before)
