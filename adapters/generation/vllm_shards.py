"""The blocks of the logical (Hugging Face) tensors that a tensor-parallel vLLM worker holds.

vLLM shards a model across ``tensor_parallel_size`` workers: a column-parallel linear layer
keeps a range of output rows (``qkv_proj`` keeps its heads' rows of q and its KV heads' rows of
k and v, a KV head being replicated when there are more workers than KV heads;
``gate_up_proj`` its rows of gate and of up), a row-parallel one a range of input columns
(its bias whole), the vocabulary embedding and head a range of vocabulary rows (padding
dropped), and everything else (norms) is replicated. :func:`tensor_parallel_shards` names each
part after its transformers tensor and says which block it is, so
:class:`~esbox.sharded.ShardedTensorSpace` draws the noise of the whole logical tensor and
every worker writes its part: a sharded engine is perturbed exactly as an unsharded one.
"""

from __future__ import annotations

from typing import Any

import torch

from esbox.sharded import Block, matrix_shape

Shard = tuple[str, torch.Tensor, Block]


def tensor_parallel_shards(model: torch.nn.Module) -> list[Shard]:
    """``(logical name, local view, block)`` of every trainable part of a vLLM worker's model.

    Views share storage with the worker's weights. Raises ValueError for a sharded layer
    whose layout esbox does not know (quantized or custom parallel layers).
    """
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        LinearBase,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    modules = dict(model.named_modules())
    shards: list[Shard] = []
    for name, parameter in model.named_parameters():
        owner, _, attr = name.rpartition(".")
        module = modules[owner]
        parent, _, leaf = owner.rpartition(".")
        data = parameter.data

        if isinstance(module, QKVParallelLinear):
            parts = _qkv_parts(module)
            shards += _rows_by_part(data, name, parts, packed.get(leaf), parent, attr)
        elif isinstance(module, MergedColumnParallelLinear):
            parts = [
                (size // module.tp_size, size, module.tp_rank * (size // module.tp_size))
                for size in module.output_sizes
            ]
            shards += _rows_by_part(data, name, parts, packed.get(leaf), parent, attr)
        elif isinstance(module, ColumnParallelLinear):
            local = module.output_size_per_partition
            logical = (local * module.tp_size, *data.shape[1:])
            start = module.tp_rank * local
            shards.append((name, data, Block.of_rows(logical, start, start + local)))
        elif isinstance(module, RowParallelLinear) and attr == "weight":
            local = module.input_size_per_partition
            logical = (data.shape[0], local * module.tp_size)
            start = module.tp_rank * local
            shards.append((name, data, Block.of_columns(logical, start, start + local)))
        elif isinstance(module, VocabParallelEmbedding):
            shards.append(_vocabulary_rows(name, data, module))
        elif isinstance(module, LinearBase) and not isinstance(
            module, (ReplicatedLinear, RowParallelLinear)
        ):
            raise ValueError(
                f"{name}: esbox does not know how {type(module).__name__} shards its weights "
                "(tensor_parallel_size > 1 supports vLLM's plain column-, row- and "
                "vocabulary-parallel layers)"
            )
        else:  # replicated: norms, a row-parallel bias, replicated linear layers
            shards.append((name, data, Block.whole(data.shape)))
    return shards


def _qkv_parts(module: Any) -> list[tuple[int, int, int]]:
    """``(local rows, logical rows, first logical row)`` of q, k and v in a worker's
    ``qkv_proj`` (a KV head is held by ``num_kv_head_replicas`` workers)."""
    kv_shard = module.tp_rank // module.num_kv_head_replicas
    q = module.num_heads * module.head_size
    k = module.num_kv_heads * module.head_size
    v = module.num_kv_heads * module.v_head_size
    return [
        (q, module.total_num_heads * module.head_size, module.tp_rank * q),
        (k, module.total_num_kv_heads * module.head_size, kv_shard * k),
        (v, module.total_num_kv_heads * module.v_head_size, kv_shard * v),
    ]


def _rows_by_part(
    data: torch.Tensor,
    name: str,
    parts: list[tuple[int, int, int]],
    names: list[str] | None,
    parent: str,
    attr: str,
) -> list[Shard]:
    """Split a fused column-parallel tensor into its parts' row blocks."""
    if names is None or len(names) != len(parts):
        raise ValueError(f"{name}: no packed_modules_mapping entry naming its {len(parts)} parts")
    if sum(local for local, _, _ in parts) != data.shape[0]:
        raise ValueError(f"{name}: cannot split {tuple(data.shape)} into parts {parts}")
    out, row = [], 0
    for part_name, (local, logical, start) in zip(names, parts, strict=True):
        full_name = f"{parent}.{part_name}.{attr}" if parent else f"{part_name}.{attr}"
        block = Block.of_rows((logical, *data.shape[1:]), start, start + local)
        out.append((full_name, data[row : row + local], block))
        row += local
    return out


def _vocabulary_rows(name: str, data: torch.Tensor, module: Any) -> Shard:
    """A worker's rows of the real vocabulary (its padding rows are not trained)."""
    indices = module.shard_indices
    if indices.num_added_elements:
        raise ValueError(f"{name}: added (LoRA) vocabulary rows are not supported")
    start, stop = indices.org_vocab_start_index, indices.org_vocab_end_index
    if stop <= start:
        raise ValueError(f"{name}: this worker holds no row of the real vocabulary")
    logical = (module.org_vocab_size, *data.shape[1:])
    return name, data[: stop - start], Block.of_rows(logical, start, stop)


def check_logical_shapes(shards: list[Shard], shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError unless the shards name exactly the transformers tensors, each block
    spanning its tensor's shape."""
    names = [n for n, _, _ in shards]
    missing = [n for n in shapes if n not in set(names)]
    extra = [n for n in names if n not in shapes]
    if missing or extra:
        raise ValueError(
            "the sharded vLLM model's tensors do not match the transformers model's "
            f"(missing: {missing[:6]}, only in vLLM: {extra[:6]})"
        )
    for name, _, block in shards:
        if (block.rows, block.cols) != matrix_shape(shapes[name]):
            raise ValueError(
                f"{name}: the shards span {block.rows} x {block.cols}, the transformers "
                f"tensor is {tuple(shapes[name])}"
            )
