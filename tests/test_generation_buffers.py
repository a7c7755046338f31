"""CPU generation without allocation churn: kept KV buffers, copy-free GQA, malloc settings.

The guard of issue 34: greedy outputs are the same as transformers' own cache and attention
gave before, at every batch size, and the buffers are reused rather than reallocated.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from esbox.adapters.generation import HFBackend  # noqa: E402
from esbox.adapters.generation.gqa_attention import NAME, use_gqa_attention  # noqa: E402
from esbox.adapters.generation.kv_cache import KVBuffers, reused_cache  # noqa: E402
from esbox.adapters.models.testing import char_tokenizer, tiny_causal_lm  # noqa: E402

QUESTIONS = [f"What is {a} + {b}?" for a, b in [(3, 4), (12, 30), (7, 7), (41, 9)]]
PROMPTS = [
    [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": q}]
    for q in QUESTIONS * 4
]


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def _model(tokenizer, arch: str, dtype):
    return tiny_causal_lm(arch, len(tokenizer)).to(dtype)


def _outputs_as_before(model, tokenizer, **generate):
    """What the backend gave before issue 34: transformers' cache and ``sdpa`` attention."""
    model.set_attn_implementation("sdpa")
    return HFBackend(model, tokenizer, reuse_memory=False).generate(PROMPTS, **generate)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_outputs_are_the_same_as_before_at_every_batch_size(tokenizer, arch, dtype):
    model = _model(tokenizer, arch, dtype)
    before = _outputs_as_before(model, tokenizer, max_new_tokens=12)
    assert model.config._attn_implementation == "sdpa"
    for share_prefix in (True, False):
        for batch_size in (1, 3, 8, 16):
            backend = HFBackend(model, tokenizer, batch_size=batch_size, share_prefix=share_prefix)
            assert model.config._attn_implementation == NAME
            assert backend.generate(PROMPTS, max_new_tokens=12) == before


def test_grouped_rows_are_the_same_as_before(tokenizer):
    model = _model(tokenizer, "llama", torch.float32)
    before = _outputs_as_before(model, tokenizer, max_new_tokens=10, groups=4)
    after = HFBackend(model, tokenizer).generate(PROMPTS, max_new_tokens=10, groups=4)
    assert after == before


def test_buffers_are_reused_across_calls(tokenizer):
    backend = HFBackend(_model(tokenizer, "llama", torch.float32), tokenizer)
    backend.generate(PROMPTS, max_new_tokens=12)
    held = {key: flat.data_ptr() for key, flat in backend._kv_buffers._store.items()}
    assert len(held) == 2 * 2  # keys and values of both layers
    backend.generate(PROMPTS[:5], max_new_tokens=6)  # fewer rows, shorter: the same storage
    backend.generate(PROMPTS, max_new_tokens=12)
    assert {key: flat.data_ptr() for key, flat in backend._kv_buffers._store.items()} == held


def test_a_layer_past_its_capacity_moves_to_larger_buffers_and_keeps_its_contents(tokenizer):
    model = _model(tokenizer, "llama", torch.float32)
    buffers = KVBuffers()
    cache = reused_cache(model, buffers, capacity=3)
    layer = cache.layers[0]
    chunks = [torch.randn(2, 2, n, 8) for n in (2, 1, 4, 1)]
    for chunk in chunks:
        keys, values = layer.update(chunk, -chunk)
    expected = torch.cat(chunks, dim=-2)
    assert torch.equal(keys, expected) and torch.equal(values, -expected)
    assert layer.get_seq_length() == 8
    layer.crop(-3)
    assert torch.equal(layer.keys, expected[:, :, :5])
    keys, _ = layer.update(chunks[1], chunks[1])
    assert torch.equal(keys, torch.cat([expected[:, :, :5], chunks[1]], dim=-2))


def test_sliding_window_models_keep_transformers_cache(tokenizer):
    config = transformers.MistralConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert reused_cache(model, KVBuffers(), 16) is None
    text = HFBackend(model, tokenizer).generate(PROMPTS[:2], max_new_tokens=4)
    assert len(text) == 2


def test_gqa_attention_is_bit_identical_to_sdpa(tokenizer):
    model = _model(tokenizer, "qwen2", torch.bfloat16)
    ids = torch.randint(6, len(tokenizer), (3, 11))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding: the masked path that used to copy keys and values
    with torch.inference_mode():
        model.set_attn_implementation("sdpa")
        before = model(input_ids=ids, attention_mask=mask).logits
        assert use_gqa_attention(model)
        after = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(before, after)


def test_models_without_grouped_heads_keep_sdpa(tokenizer):
    model = tiny_causal_lm("llama", len(tokenizer), num_key_value_heads=4)
    assert not use_gqa_attention(model)
    assert model.config._attn_implementation == "sdpa"


CHECK_ALLOCATOR = (
    "from esbox.adapters.generation.allocator import keep_freed_memory; "
    "print(keep_freed_memory())"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
@pytest.mark.parametrize(
    ("variable", "applied"), [(None, "True"), ("MALLOC_TRIM_THRESHOLD_", "False")]
)
def test_malloc_settings_apply_unless_the_user_set_their_own(variable, applied):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if variable:
        env[variable] = "131072"
    out = subprocess.run(
        [sys.executable, "-c", CHECK_ALLOCATOR], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == applied
