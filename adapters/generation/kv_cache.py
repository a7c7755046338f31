"""A KV cache written in place into buffers that live across ``generate`` calls.

transformers' ``DynamicCache`` grows every layer's keys and values by ``torch.cat`` at every
token. On a CPU each new tensor of a large batch is freshly mapped memory, so the kernel spends
its time serving page faults (a third of the CPU time at 64 rows, docs/benchmarks.md). Here each
layer's keys and values are views of buffers that the backend keeps: a call writes its tokens
into them, and the next call reuses them, growing a buffer only when a call needs more.
"""

from __future__ import annotations

import math
from typing import Any

from esbox.adapters.models.loading import require_transformers


class KVBuffers:
    """Flat key and value storage per layer, kept for the next call and grown only on demand."""

    def __init__(self) -> None:
        self._store: dict[tuple[int, str], Any] = {}

    def take(self, layer: int, kind: str, shape: tuple[int, ...], like: Any) -> Any:
        """A tensor of ``shape`` on ``like``'s dtype and device, backed by the kept storage."""
        import torch

        size = math.prod(shape)
        flat = self._store.get((layer, kind))
        fits = flat is not None and flat.numel() >= size
        if not fits or (flat.dtype, flat.device) != (like.dtype, like.device):
            flat = torch.empty(size, dtype=like.dtype, device=like.device)
            self._store[(layer, kind)] = flat
        return flat[:size].view(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held between calls."""
        return sum(t.numel() * t.element_size() for t in self._store.values())

    def clear(self) -> None:
        """Let the storage go (the next call allocates it again)."""
        self._store.clear()


def reused_cache(model: Any, buffers: KVBuffers, capacity: int) -> Any:
    """A cache for ``model`` whose layers write into ``buffers`` (``capacity`` tokens a row),
    or ``None`` where the model's cache is not made of plain full-attention layers (sliding
    windows, linear attention, ...): those keep transformers' own cache."""
    require_transformers()
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = DynamicCache(config=model.config).layers
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    base = _reused_layer_class(DynamicLayer)
    cache = DynamicCache(config=model.config)
    cache.layers = [base(buffers, index, capacity) for index in range(len(layers))]
    return cache


def fill_prefix(cache: Any, prefix: Any, repeats: int) -> None:
    """Write the shared prefix's keys and values (one row per group) into every row of
    ``cache``, each group's row ``repeats`` times."""
    for layer, source in zip(cache.layers, prefix.layers, strict=True):
        layer.extend(source.keys, source.values, repeats)


_CLASSES: dict[type, type] = {}


def _reused_layer_class(dynamic_layer: type) -> type:
    """``DynamicLayer`` with ``update`` writing in place (built once, on first use, because
    transformers is imported lazily)."""
    if dynamic_layer in _CLASSES:
        return _CLASSES[dynamic_layer]

    class ReusedLayer(dynamic_layer):  # type: ignore[misc, valid-type]
        """One layer's keys and values: views ``[:, :, :length]`` of kept buffers."""

        def __init__(self, buffers: KVBuffers, index: int, capacity: int) -> None:
            super().__init__()
            self._buffers, self._index, self._capacity = buffers, index, capacity
            self._length, self._keys = 0, None

        def lazy_initialization(self, key_states: Any, value_states: Any, repeats: int = 1) -> None:
            self.dtype, self.device = key_states.dtype, key_states.device
            self._rows = key_states.shape[0] * repeats
            self._allocate(key_states, value_states, self._capacity)
            self.is_initialized = True

        def _allocate(self, key_states: Any, value_states: Any, capacity: int) -> None:
            heads = key_states.shape[1]
            shapes = {
                "k": (self._rows, heads, capacity, key_states.shape[-1]),
                "v": (self._rows, heads, capacity, value_states.shape[-1]),
            }
            self._capacity = capacity
            self._keys = self._buffers.take(self._index, "k", shapes["k"], key_states)
            self._values = self._buffers.take(self._index, "v", shapes["v"], value_states)

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            return self.extend(key_states, value_states)

        def extend(self, key_states: Any, value_states: Any, repeats: int = 1) -> tuple[Any, Any]:
            """Write the new positions after the cached ones, each input row into ``repeats``
            consecutive rows (broadcast, no copy made); return the keys and values so far."""
            if self._keys is None:
                self.lazy_initialization(key_states, value_states, repeats)
            end = self._length + key_states.shape[-2]
            if end > self._capacity:  # longer than planned: move to larger buffers once
                keys, values = self.keys.clone(), self.values.clone()
                self._allocate(keys, values, max(end, 2 * self._capacity))
                self._keys[:, :, : self._length].copy_(keys)
                self._values[:, :, : self._length].copy_(values)
            new = slice(self._length, end)
            for buffer, states in ((self._keys, key_states), (self._values, value_states)):
                target = buffer[:, :, new].unflatten(0, (states.shape[0], repeats))
                target.copy_(states.unsqueeze(1))
            self._length = end
            self.keys = self._keys[:, :, :end]
            self.values = self._values[:, :, :end]
            return self.keys, self.values

        def crop(self, tokens_to_remove: int) -> None:
            super().crop(tokens_to_remove)
            self._length = self.keys.shape[-2]

    _CLASSES[dynamic_layer] = ReusedLayer
    return ReusedLayer
