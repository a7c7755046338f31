"""TorchModuleSpace with the weights on an accelerator: every test runs on the CPU and, where
there is one, on CUDA (skipped with the reason otherwise), so the same body checks both.

Pinned on each device: exact restore (backup on the host or on the device), noise drawn on
the weights' device, bit-identical replay on two replicas, CoPES partitions, and a real
generation under a sweep.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import esbox  # noqa: E402
from esbox.adapters.generation import HFBackend  # noqa: E402
from esbox.adapters.models.space import TorchModuleSpace  # noqa: E402
from esbox.adapters.models.testing import char_tokenizer, tiny_causal_lm  # noqa: E402

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = [pytest.mark.gpu, NO_CUDA]
# (weights' device, backup device)
PLACEMENTS = [
    pytest.param("cpu", "cpu", id="cpu"),
    pytest.param("cuda", "cpu", id="cuda-host-backup", marks=CUDA),
    pytest.param("cuda", "cuda", id="cuda-device-backup", marks=CUDA),
]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=CUDA)]
DTYPES = [torch.float32, torch.bfloat16]


def tiny_model(device: str, dtype=torch.float32, seed: int = 0, vocab_size: int = 64):
    model = tiny_causal_lm("llama", vocab_size=vocab_size, seed=seed)
    return model.to(device=device, dtype=dtype).requires_grad_(False)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def strategy(space, name: str = "copes", **options):
    defaults = {"population": 8, "sigma": 0.01, "learning_rate": 1e-3}
    if name == "copes":
        defaults["subspaces"] = 2
    return esbox.make_strategy(name, space, seed=5, **{**defaults, **options})


@pytest.mark.parametrize(("device", "backup"), PLACEMENTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sweep_restores_exactly_on_the_device(device, backup, dtype):
    model = tiny_model(device, dtype)
    space = TorchModuleSpace(model, chunk_size=600, backup_device=backup)
    before = snapshot(model)
    members = strategy(space).ask()
    with space.sweep(members) as sweep:
        for _ in sweep:
            assert not same(before, snapshot(model))
            assert all(p.device.type == device for p in model.parameters())
    assert same(before, snapshot(model))
    with pytest.raises(RuntimeError, match="boom"), space.sweep(members) as sweep:
        next(sweep)
        raise RuntimeError("boom")
    assert same(before, snapshot(model))


@pytest.mark.parametrize("device", DEVICES)
def test_noise_is_drawn_on_the_weights_device_and_replays(device):
    space = TorchModuleSpace(tiny_model(device), chunk_size=500)
    member = strategy(space).ask()[0]
    first = [noise for _, noise in space.noise(member)]
    again = [noise for _, noise in space.noise(member)]
    assert all(n.device.type == device and n.dtype == torch.float32 for n in first)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_update_replay_on_two_replicas_is_bit_identical_on_the_device(device, dtype):
    a, b = tiny_model(device, dtype), tiny_model(device, dtype)
    space_a, space_b = TorchModuleSpace(a, chunk_size=900), TorchModuleSpace(b, chunk_size=900)
    es = strategy(space_a, optimizer="adam")
    for step in range(3):
        es.ask()
        update = es.tell(np.sin(np.arange(8.0) + step))
        space_a.apply(update)
        space_b.apply(esbox.Update.from_dict(update.to_dict()))
    assert same(snapshot(a), snapshot(b))
    assert not same(snapshot(a), snapshot(tiny_model(device, dtype)))


@pytest.mark.parametrize("device", DEVICES)
def test_copes_members_change_only_their_subspace_on_the_device(device):
    model = tiny_model(device)
    space = TorchModuleSpace(model, chunk_size=700)
    flat_before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    members = strategy(space, subspaces=4).ask()
    changed = []
    with space.sweep(members) as sweep:
        for _ in sweep:
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            changed.append(flat != flat_before)
    by_subspace: dict[int, torch.Tensor] = {}
    for member, mask in zip(members, changed, strict=True):
        seen = by_subspace.setdefault(member.subspace, torch.zeros_like(mask))
        by_subspace[member.subspace] = seen | mask
    masks = list(by_subspace.values())
    assert len(masks) == 4
    for i in range(4):  # members of different subspaces never touch the same weight
        for j in range(i + 1, 4):
            assert not bool((masks[i] & masks[j]).any())


@pytest.mark.parametrize("device", DEVICES)
def test_generation_under_a_sweep_on_the_device(device):
    tokenizer = char_tokenizer()
    model = tiny_model(device, vocab_size=len(tokenizer))
    backend = HFBackend(model, tokenizer)
    space = TorchModuleSpace(model)
    before = snapshot(model)
    prompts = ["abc", "hello"]
    base = backend.generate(prompts, max_new_tokens=6)
    members = strategy(space, "openai_es", sigma=0.5).ask()[:2]
    with space.sweep(members) as sweep:
        outputs = [backend.generate(prompts, max_new_tokens=6) for _ in sweep]
    assert same(before, snapshot(model))
    assert backend.generate(prompts, max_new_tokens=6) == base
    assert any(out != base for out in outputs), "a large perturbation should change a completion"
