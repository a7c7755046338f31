"""HFBackend on tiny random Llama/Qwen2 models with a character tokenizer built in code."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from esbox.adapters.generation import GenerationBackend, HFBackend  # noqa: E402
from esbox.adapters.generation.backend import common_prefix_len, truncate_at_stop  # noqa: E402
from esbox.adapters.models.testing import char_tokenizer  # noqa: E402
from esbox.adapters.models.testing import tiny_causal_lm as tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tokenizer):
    return tiny_model(request.param, len(tokenizer))


PROMPTS = [
    [{"role": "user", "content": "What is 3 + 4?"}],
    [{"role": "user", "content": "What is 12 + 30?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "raw prompt without template",
]
PREFILLS = ["3 + 4 = ", "12 + 30 = ", None, ""]


def test_backend_satisfies_protocol(model, tokenizer):
    assert isinstance(HFBackend(model, tokenizer), GenerationBackend)


def test_render_applies_template_and_prefill(model, tokenizer):
    backend = HFBackend(model, tokenizer)
    text = backend.render(PROMPTS[0], "3 + 4 = ")
    assert text == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n3 + 4 = "
    assert backend.render("plain", None) == "plain"


@pytest.mark.parametrize("share_prefix", [True, False])
def test_greedy_is_deterministic_and_batch_invariant(model, tokenizer, share_prefix):
    backend = HFBackend(model, tokenizer, share_prefix=share_prefix)
    batched = backend.generate(PROMPTS, prefills=PREFILLS, max_new_tokens=8)
    again = backend.generate(PROMPTS, prefills=PREFILLS, max_new_tokens=8)
    single = [
        backend.generate([p], prefills=[f], max_new_tokens=8)[0]
        for p, f in zip(PROMPTS, PREFILLS, strict=True)
    ]
    assert batched == again == single
    assert len({*batched}) > 1, "random model should not give the same text for every prompt"


def test_shared_prefix_matches_plain_batching(model, tokenizer):
    chats = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in [(1, 2), (10, 20)]]
    prefills = ["1 + 2 = ", "10 + 20 = "]
    shared = HFBackend(model, tokenizer, share_prefix=True, min_shared_prefix=1)
    plain = HFBackend(model, tokenizer, share_prefix=False)
    assert (
        common_prefix_len([shared.encode(c, f) for c, f in zip(chats, prefills, strict=True)]) > 10
    )
    kwargs = dict(prefills=prefills, max_new_tokens=6)
    assert shared.generate(chats, **kwargs) == plain.generate(chats, **kwargs)


def test_small_batch_size_gives_same_greedy_output(model, tokenizer):
    full = HFBackend(model, tokenizer).generate(PROMPTS, prefills=PREFILLS, max_new_tokens=5)
    chunked = HFBackend(model, tokenizer, batch_size=3)
    assert chunked.generate(PROMPTS, prefills=PREFILLS, max_new_tokens=5) == full


def test_stop_strings_truncate(model, tokenizer):
    backend = HFBackend(model, tokenizer, share_prefix=False)
    plain = backend.generate(PROMPTS[:2], prefills=PREFILLS[:2], max_new_tokens=10)
    text = next(t for t in plain if len(t) >= 4)
    stop = text[2:4]
    cut = backend.generate(PROMPTS[:2], prefills=PREFILLS[:2], max_new_tokens=10, stop=[stop])
    for full, short in zip(plain, cut, strict=True):
        assert short == truncate_at_stop(full, [stop])
        assert stop not in short
    assert text[: text.find(stop)] in cut


def test_truncate_at_stop_earliest_wins():
    assert truncate_at_stop("a1b2c", ["2", "1"]) == "a"
    assert truncate_at_stop("abc", ["x"]) == "abc"
    assert truncate_at_stop("abc", None) == "abc"


def test_sampling_with_seed_is_reproducible_and_keeps_global_rng(model, tokenizer):
    backend = HFBackend(model, tokenizer)
    kwargs = dict(prefills=PREFILLS, max_new_tokens=8, greedy=False, num_samples=2)
    state = torch.get_rng_state()
    a = backend.generate(PROMPTS, seed=123, **kwargs)
    assert torch.equal(state, torch.get_rng_state())
    b = backend.generate(PROMPTS, seed=123, **kwargs)
    c = backend.generate(PROMPTS, seed=124, **kwargs)
    assert a == b
    assert a != c
    assert len(a) == len(PROMPTS) * 2


def test_greedy_num_samples_repeats_prompt_major(model, tokenizer):
    backend = HFBackend(model, tokenizer)
    once = backend.generate(PROMPTS[:2], prefills=PREFILLS[:2], max_new_tokens=4)
    three = backend.generate(PROMPTS[:2], prefills=PREFILLS[:2], max_new_tokens=4, num_samples=3)
    assert three == [once[0]] * 3 + [once[1]] * 3


def test_no_autograd_during_generation(model, tokenizer):
    seen = []

    def hook(module, args, kwargs):
        seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        HFBackend(model, tokenizer).generate(PROMPTS, prefills=PREFILLS, max_new_tokens=3)
    finally:
        handle.remove()
    assert seen
    assert all(not grad and inference for grad, inference in seen)


@pytest.mark.parametrize("share_prefix", [True, False])
def test_output_head_sees_contiguous_input(model, tokenizer, share_prefix):
    """The prefill's last position reaches the head as a copy, not a strided view (a strided
    bf16 input makes CPU matmul materialise the head weight once per row)."""
    head = model.get_output_embeddings()
    hooks_before = len(head._forward_pre_hooks)
    seen = []
    handle = head.register_forward_hook(
        lambda _m, args, _out: seen.append((args[0].shape[0], args[0].is_contiguous()))
    )
    try:
        backend = HFBackend(model, tokenizer, share_prefix=share_prefix, min_shared_prefix=1)
        backend.generate(PROMPTS, prefills=PREFILLS, max_new_tokens=3)
    finally:
        handle.remove()
    assert any(rows == len(PROMPTS) for rows, _ in seen)
    assert all(contiguous for _, contiguous in seen)
    assert len(head._forward_pre_hooks) == hooks_before, "the backend leaves no hook behind"


def test_in_place_weight_edits_are_seen(tokenizer):
    model = tiny_model("llama", len(tokenizer), seed=1)
    backend = HFBackend(model, tokenizer)
    before = backend.generate(PROMPTS, prefills=PREFILLS, max_new_tokens=6)
    weight = model.model.layers[0].mlp.down_proj.weight
    backup = weight.detach().clone()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    after = backend.generate(PROMPTS, prefills=PREFILLS, max_new_tokens=6)
    assert after != before
    assert not torch.equal(weight, backup)


def test_bad_arguments(model, tokenizer):
    backend = HFBackend(model, tokenizer)
    with pytest.raises(TypeError):
        backend.generate("one string")
    with pytest.raises(ValueError):
        backend.generate(PROMPTS, prefills=PREFILLS[:1])
    with pytest.raises(ValueError):
        backend.generate(PROMPTS, max_new_tokens=0)


def test_common_prefix_len():
    assert common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_len([[5], [6]]) == 0
    assert common_prefix_len([]) == 0
