"""What crosses vLLM's RPC: tensors as safetensors bytes, worker exceptions as values."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from esbox.errors import ResumeError


def digest(tensors: Sequence[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def pack_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """Tensors as safetensors bytes: RPC results and arguments are msgpack-encoded, which
    turns tensors into lists; bytes cross unchanged."""
    from safetensors.torch import save

    return save({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()})


def unpack_tensors(data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(bytes(data))


ERROR_KEY = "__esbox_error__"
_ERRORS: dict[str, type[Exception]] = {
    e.__name__: e
    for e in (ValueError, TypeError, KeyError, RuntimeError, NotImplementedError, ResumeError)
}


def reported(method: Callable[..., Any]) -> Callable[..., Any]:
    """Return a worker method's exception as a value: raised inside vLLM's executor it would
    be logged as an engine failure; the driver re-raises it (:func:`raise_reported`)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            return {ERROR_KEY: [type(exc).__name__, str(exc)]}

    return wrapper


def raise_reported(result: Any) -> Any:
    if isinstance(result, dict) and ERROR_KEY in result:
        name, message = result[ERROR_KEY]
        error = _ERRORS.get(name)
        raise error(message) if error else RuntimeError(f"in a vLLM worker: {name}: {message}")
    return result
