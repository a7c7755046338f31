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


# -- agent trajectories: memory as the trajectory grows ------------------------------------------
def smollm2_config():
    """The shipped SmolLM2-135M's shape, built in code (tied embeddings, GQA 9/3 heads)."""
    return transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )


def test_grpo_backprop_grows_with_trajectory_tokens_times_group():
    from esbox.adapters.models.trajectory_memory import estimate_trajectory_memory

    config = tiny_config()
    act, logits = "activations (backprop)", "logits (loss)"
    for group in (1, 4):
        growth = estimate_trajectory_memory(config, [1024, 2048, 4096], batch=group)
        a = growth.device(GRPO, act)
        assert a[1] == 2 * a[0] and a[2] == 4 * a[0]  # linear in the tokens (flash attention)
        assert growth.device(LORA, act) == a  # LoRA back-propagates through the whole model
        assert growth.device(GRPO, logits)[2] == 4 * 4096 * group * COMMON["vocab_size"]
    one = estimate_trajectory_memory(config, ["4k"], batch=1).device(GRPO, act)[0]
    four = estimate_trajectory_memory(config, ["4k"], batch=4).device(GRPO, act)[0]
    assert four == 4 * one  # and linear in the group


def test_es_kv_cache_grows_linearly_but_far_slower_than_grpo():
    from esbox.adapters.models.trajectory_memory import KV, estimate_trajectory_memory

    shape = model_shape(smollm2_config())
    growth = estimate_trajectory_memory(shape, [1024, 2048, 8192], batch=8)
    kv = growth.device(ES, KV)
    per_token = 2 * 8 * shape.layers * shape.kv_heads * shape.head_dim * 2  # K and V, bf16
    assert kv == [1024 * per_token, 2048 * per_token, 8192 * per_token]
    es, grpo, lora = (growth.device(k) for k in (ES, GRPO, LORA))
    es_slope, grpo_slope = es[2] - es[0], grpo[2] - grpo[0]
    assert grpo_slope > 15 * es_slope  # per token, GRPO's backward costs >15x ES's inference
    assert all(e < lo < g for e, lo, g in zip(es, lora, grpo, strict=True))
    ratios = [g / e for g, e in zip(grpo, es, strict=True)]
    assert ratios == sorted(ratios) and ratios[-1] > 15  # the gap widens as trajectories grow


def test_turns_build_the_length_and_change_nothing_else():
    from esbox.adapters.models.trajectory_memory import (
        Trajectory,
        estimate_trajectory_memory,
        trajectories,
    )

    grown = trajectories(turn_tokens=512, turns=[1, 4, 16], prompt_tokens=256)
    assert [t.tokens for t in grown] == [768, 2304, 8448]
    assert grown[1].label == "2,304 = 256 + 4 x 512"
    assert [t.turns for t in trajectories(turn_tokens=100)] == [1, 2, 4, 8, 16]
    rows = trajectories(tokens=[2048], turns=[1, 8])
    assert rows == [Trajectory(2048, 1), Trajectory(2048, 8)]
    growth = estimate_trajectory_memory(tiny_config(), rows, batch=2)
    assert growth.estimates[0].to_dict() == growth.estimates[1].to_dict()
    assert "rows of one length are equal whatever their turns" in growth.table()
    with pytest.raises(ValueError, match="either tokens"):
        trajectories(tokens=[1024], turn_tokens=64)
    with pytest.raises(ValueError, match="turns >= 1"):
        Trajectory(1024, 0)
    with pytest.raises(TypeError, match="context"):
        estimate_trajectory_memory(tiny_config(), [1024], context=8)


def test_trajectory_table_has_a_row_per_trajectory_and_every_method():
    from esbox.adapters.models.trajectory_memory import estimate_trajectory_memory, trajectories

    rows = trajectories(tokens=[512, 4096, 32768], turns=[4])
    table = estimate_trajectory_memory(tiny_config(), rows, batch=4).table()
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| turns"))
    for name in ("ES (esbox)", "GRPO (full)", "LoRA-GRPO (r=16)", "GRPO / ES"):
        assert f"| {name} |" in header
    body = [line for line in lines if line.startswith("| 4 |")]
    assert [line.split("|")[2].strip() for line in body] == ["512", "4,096", "32,768"]
    assert all(line.count("|") == header.count("|") for line in body)
    assert "Each token of trajectory length (512 to 32,768" in table


@pytest.mark.parametrize(
    ("text", "tokens"), [("1k,4k", [1024, 4096]), ("512", [512]), (" 2k , 8192 ", [2048, 8192])]
)
def test_parse_token_list(text, tokens):
    from esbox.adapters.models.trajectory_memory import parse_token_list

    assert parse_token_list(text) == tokens


@pytest.mark.parametrize("bad", ["", ",", "1k,abc", "0", "1.5"])
def test_parse_lists_reject_bad_input(bad):
    from esbox.adapters.models.trajectory_memory import parse_count_list, parse_token_list

    with pytest.raises(ValueError, match="token count"):
        parse_token_list(bad)
    with pytest.raises(ValueError, match="whole numbers"):
        parse_count_list(bad)
    assert parse_count_list("1, 4,16") == [1, 4, 16]


@pytest.fixture
def config_dir(tmp_path):
    tiny_config().save_pretrained(tmp_path)
    return tmp_path


def memory_cli(*args: str):
    from click.testing import CliRunner

    from esbox.cli.main import cli

    return CliRunner().invoke(cli, ["memory", *args], catch_exceptions=False)


def test_cli_prints_a_row_for_each_trajectory_length(config_dir):
    result = memory_cli("--model", str(config_dir), "--trajectory-tokens", "1k,4k,16k",
                        "--turns", "4", "--batch", "8")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| 4 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1,024", "4,096", "16,384"]
    assert "| ES (esbox) | GRPO (full) | LoRA-GRPO (r=16) |" in result.output
    grown = memory_cli("--model", str(config_dir), "--turn-tokens", "300", "--turns", "1,3",
                       "--prompt-tokens", "100", "--json")  # fmt: skip
    assert grown.exit_code == 0, grown.output
    data = json.loads(grown.output)["rows"]
    assert [(r["turns"], r["tokens"], r["context"]) for r in data] == [
        (1, 400, 400),
        (3, 1000, 1000),
    ]
    formulas = memory_cli("--model", str(config_dir), "--trajectory-tokens", "1k,2k", "--formulas")
    assert "context 2,048 tokens" in formulas.output and "*GRPO (full)*" in formulas.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trajectory-tokens", "1k,lots"], "--trajectory-tokens"),
        (["--trajectory-tokens", "1k", "--turns", "0"], "--turns"),
        (["--turn-tokens", "0"], "--turn-tokens"),
        (["--turns", "4"], "--turns needs --trajectory-tokens or --turn-tokens"),
        (["--trajectory-tokens", "1k", "--turn-tokens", "64"], "not both"),
        (["--trajectory-tokens", "1k", "--context", "8k"], "--context is one length"),
        (["--prompt-tokens", "64"], "--prompt-tokens needs --turn-tokens"),
    ],
)
def test_cli_bad_trajectory_input_exits_2_naming_the_flag(config_dir, args, message):
    result = memory_cli("--model", str(config_dir), *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
