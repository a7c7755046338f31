"""Theoretical memory estimates: exact parameter counts, linear KV growth, ES below GRPO."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from esbox.adapters.models.memory import ES, GRPO, LORA, estimate_memory  # noqa: E402
from esbox.adapters.models.shapes import (  # noqa: E402
    LORA_TARGETS,
    _count_closed_form,
    model_shape,
    parse_context,
)
from esbox.adapters.models.space import MODEL_CHUNK_SIZE  # noqa: E402
from esbox.noise import DEFAULT_TABLE_SIZE  # noqa: E402
from esbox.partition import pattern_length  # noqa: E402

COMMON = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def tiny_config(arch: str = "llama", tie: bool = True):
    cls = transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config
    return cls(**COMMON, tie_word_embeddings=tie)


def real_model(config):
    model_cls = (
        transformers.LlamaForCausalLM
        if config.model_type == "llama"
        else transformers.Qwen2ForCausalLM
    )
    return model_cls(config)


@pytest.mark.parametrize(("arch", "tie"), [("llama", True), ("llama", False), ("qwen2", False)])
def test_parameter_count_matches_a_real_tiny_model(arch, tie):
    config = tiny_config(arch, tie)
    model = real_model(config)
    shape = model_shape(config)
    assert shape.counted == "meta"
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert shape.largest_tensor == max(p.numel() for p in model.parameters())
    if tie:  # the shared embedding / LM head tensor is counted once
        assert shape.parameters < sum(p.numel() for p in model.state_dict().values())


def test_lora_count_is_rank_times_in_plus_out_of_every_target():
    config = tiny_config()
    model = real_model(config)
    expected = sum(
        16 * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if name.rsplit(".", 1)[-1] in LORA_TARGETS
    )
    assert model_shape(config).lora_parameters(16) == expected
    assert len(model_shape(config).lora_matrices) == 7 * COMMON["num_hidden_layers"]


def test_closed_form_fallback_agrees_with_meta_count_for_llama():
    config = tiny_config()
    shape = model_shape(config)
    dims = {k: getattr(shape, k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim")}
    dims |= {"intermediate": shape.intermediate, "vocab": shape.vocab}
    closed = _count_closed_form(config, dims, LORA_TARGETS)
    assert closed["parameters"] == shape.parameters
    assert closed["lora_matrices"] == shape.lora_matrices


def test_config_from_folder_json_file_and_dict(tmp_path):
    config = tiny_config()
    config.save_pretrained(tmp_path)
    expected = model_shape(config).parameters
    assert model_shape(tmp_path).parameters == expected
    assert model_shape(tmp_path / "config.json").parameters == expected
    data = json.loads((tmp_path / "config.json").read_text())
    assert model_shape(data).parameters == expected
    with pytest.raises(ValueError, match=r"no config\.json"):
        model_shape(tmp_path / "missing")


@pytest.mark.parametrize("context", ["4k", "128k"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_es_is_below_grpo_and_lora_grpo(context, dtype):
    est = estimate_memory(tiny_config(), context=context, batch=4, dtype=dtype, subspaces=4)
    es, grpo, lora = est.method(ES), est.method(GRPO), est.method(LORA)
    assert es.device_bytes < lora.device_bytes < grpo.device_bytes
    assert es.device_bytes + es.host_bytes < grpo.device_bytes + grpo.host_bytes
    assert es.host_bytes == 4 * est.model.parameters  # fp32 master (bf16) or fp32 backup
    # K = 4: one byte-a-label pattern as long as a chunk, written twice, whatever the model size
    chunk = est.settings["chunk"]
    assert es.get("partition pattern (CoPES)") == 2 * pattern_length(4, chunk)


@pytest.mark.parametrize(("k", "size"), [(2, 1), (3, 1), (4, 1), (17, 1), (256, 1), (257, 4)])
def test_partition_pattern_is_a_byte_a_label_up_to_256_subspaces(k, size):
    es = estimate_memory(tiny_config(), context=16, chunk_size=1000, subspaces=k).method(ES)
    assert es.get("partition pattern (CoPES)") == 2 * pattern_length(k, 1000) * size
    formulas = {item.name: item.formula for item in es.items}
    assert f"* {size} (the step's label pattern" in formulas["partition pattern (CoPES)"]


@pytest.mark.parametrize("k", [2, 4, 17, 300])
def test_pattern_estimate_matches_what_a_real_space_keeps(k):
    import torch

    from esbox.adapters.models.space import TorchModuleSpace

    model = real_model(tiny_config())
    space = TorchModuleSpace(model, chunk_size=1000)
    pattern, windows = space._partition.draw(0, 0, k, torch.device("cpu"))
    assert len(windows) == len(space.chunks)
    estimated = estimate_memory(tiny_config(), context=16, chunk_size=1000, subspaces=k)
    assert pattern.numel() * pattern.element_size() == estimated.method(ES).get(
        "partition pattern (CoPES)"
    )
    mask = space._partition.mask(0, torch.device("cpu"), 0, 0, k, 0)
    buffer = mask.untyped_storage().nbytes()
    assert buffer == estimated.method(ES).get("subspace mask (CoPES)")


def test_more_than_256_subspaces_keep_int32_labels():
    es = estimate_memory(tiny_config(), context=16, chunk_size=1000, subspaces=300).method(ES)
    assert es.get("partition pattern (CoPES)") == 4 * 2 * pattern_length(300, 1000)
    one = estimate_memory(tiny_config(), context=16, subspaces=1).method(ES)
    assert one.get("partition pattern (CoPES)") == 0  # no partition without CoPES


def test_chunk_buffers_follow_the_space():
    c = 1024  # below the tiny model's largest tensor (64 * 32)
    est = {
        k: estimate_memory(tiny_config(), context=16, chunk_size=c, subspaces=k).method(ES)
        for k in (1, 4, 300)
    }
    # noise 4c + update 16c (two reused fp32 accumulators, the fp64 copy for the norm),
    # whatever K; CoPES's mask spans the doubled pattern instead: 8c', c' = c in whole blocks
    assert est[1].get("ES chunk buffers") == est[4].get("ES chunk buffers") == 20 * c
    assert est[300].get("ES chunk buffers") == 20 * c
    for k in (4, 300):
        assert est[k].get("subspace mask (CoPES)") == 8 * pattern_length(k, c)
    assert est[1].get("subspace mask (CoPES)") == 0
    f64 = estimate_memory(tiny_config(), context=16, chunk_size=c, dtype="float64").method(ES)
    assert f64.get("ES chunk buffers") == 28 * c  # noise 4c + fp64 update 24c


def test_chunk_defaults_to_the_model_chunk_size():
    shape = model_shape(tiny_config())
    est = estimate_memory(tiny_config(), context=16)
    assert est.settings["chunk"] == min(MODEL_CHUNK_SIZE, shape.largest_tensor)
    assert est.settings["noise"] == "generator"


def test_table_noise_replaces_the_noise_buffer_with_one_table():
    c = 1024
    gen = estimate_memory(tiny_config(), context=16, chunk_size=c).method(ES)
    table = estimate_memory(tiny_config(), context=16, chunk_size=c, noise="table").method(ES)
    assert table.get("noise table") == 4 * DEFAULT_TABLE_SIZE
    assert table.get("ES chunk buffers") == gen.get("ES chunk buffers") - 4 * c
    assert gen.get("noise table") == 0
    small = estimate_memory(
        tiny_config(), context=16, chunk_size=c, noise="table", table_size=1 << 23
    ).method(ES)
    assert small.get("noise table") == 4 << 23  # 32 MiB
    with pytest.raises(ValueError, match="exceeds the noise table"):
        estimate_memory(tiny_config(), context=16, chunk_size=c, noise="table", table_size=c - 1)


def test_kv_cache_and_activations_grow_linearly_with_context_and_batch():
    config = tiny_config()
    kv = {
        (s, b): estimate_memory(config, context=s, batch=b).method(ES).get("KV cache (rollout)")
        for s in (1024, 2048, 4096)
        for b in (1, 3)
    }
    # 2 (K and V) * layers * kv heads * head_dim * 2 bytes per token
    per_token = 2 * 2 * 2 * 8 * 2
    assert kv[1024, 1] == 1024 * per_token
    assert kv[2048, 1] == 2 * kv[1024, 1] and kv[4096, 1] == 4 * kv[1024, 1]
    assert kv[4096, 3] == 3 * kv[4096, 1]
    act = [
        estimate_memory(config, context=s).method(GRPO).get("activations (backprop)")
        for s in (1024, 2048)
    ]
    assert act[1] == 2 * act[0]  # flash attention: no s^2 term
    eager = [
        estimate_memory(config, context=s, attention="eager")
        .method(GRPO)
        .get("activations (backprop)")
        for s in (1024, 2048)
    ]
    assert eager[1] > 2 * eager[0]


def test_sliding_window_layers_cap_their_kv_cache():
    config = tiny_config()
    config.layer_types = ["sliding_attention", "full_attention"]
    config.sliding_window = 512
    shape = model_shape(config)
    assert shape.windows == (512, None)
    assert shape.attended(4096) == [512, 4096]


def test_recompute_and_no_reference_lower_grpo():
    base = estimate_memory(tiny_config(), context="8k").method(GRPO)
    assert estimate_memory(tiny_config(), context="8k", recompute=True).method(GRPO).get(
        "activations (backprop)"
    ) < base.get("activations (backprop)")
    no_ref = estimate_memory(tiny_config(), context="8k", kl_reference=False).method(GRPO)
    assert base.device_bytes - no_ref.device_bytes == 2 * model_shape(tiny_config()).parameters


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("128k", 131072), ("4096", 4096), ("1m", 1 << 20), ("32K", 32768), (" 8 k ", 8192)],
)
def test_parse_context(text, tokens):
    assert parse_context(text) == tokens
    assert parse_context(tokens) == tokens


@pytest.mark.parametrize("bad", ["", "abc", "0", "-5", "12q", "1.3k", "k", "1e3"])
def test_parse_context_rejects_bad_input_clearly(bad):
    with pytest.raises(ValueError, match="context"):
        parse_context(bad)


def test_bad_options_raise_value_error():
    with pytest.raises(ValueError, match="dtype"):
        estimate_memory(tiny_config(), context=16, dtype="int3")
    with pytest.raises(ValueError, match="attention"):
        estimate_memory(tiny_config(), context=16, attention="paged")
    with pytest.raises(ValueError, match="noise"):
        estimate_memory(tiny_config(), context=16, noise="uniform")
    with pytest.raises(ValueError, match="chunk_size"):
        estimate_memory(tiny_config(), context=16, chunk_size=0)


def test_public_names_are_importable_from_the_models_room():
    from esbox.adapters import models
    from esbox.adapters.models import memory, shapes

    assert models.estimate_memory is memory.estimate_memory
    for name in ("model_shape", "parse_context"):
        assert getattr(models, name) is getattr(shapes, name)


def test_markdown_table_names_every_method_and_the_host_backup():
    est = estimate_memory(tiny_config(), context="128k", subspaces=4)
    table = est.table(formulas=True)
    for name in ("ES (esbox, CoPES K=4)", "GRPO (full)", "LoRA-GRPO (r=16)"):
        assert f"| {name} " in table.splitlines()[4]  # the header row
        assert f"*{name}*" in table
    assert "host (exact backup / fp32 master)" in table
    assert "exceeds the model's max_position_embeddings" in table
    assert all(line.count("|") == 5 for line in table.splitlines()[4:] if line.startswith("|"))
