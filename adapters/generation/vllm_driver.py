"""vLLM backend: the weights live in vLLM's workers and are perturbed there, in place.

Three parts (DESIGN §6):

* :class:`~esbox.adapters.generation.vllm_worker.EsboxWorkerExtension`, the vLLM *worker extension*
  (its own module, which vLLM imports in every worker): a parameter space over the worker's
  model behind ``esbox_*`` RPC methods.
* :class:`VLLMSpace`, the driver-side space: the interface the esbox ``Runner`` and the
  rollout evaluator use (``sweep``, ``perturbed``, ``apply``, ``state_dict``,
  ``load_state_dict``, ``dimension``, ``chunks``, ``names``), each call one RPC.
* :class:`VLLMBackend`, a :class:`~esbox.adapters.generation.backend.GenerationBackend` that runs
  batched greedy or seeded sampling through ``SamplingParams`` (max tokens, stop strings).

Weights are edited in place, so storage addresses never change (CUDA graphs captured by
vLLM keep pointing at the live weights), and prefix caching must be off: cached KV blocks
would belong to the weights of another member. :func:`make_llm` sets both up. The noise layout
(``layout="hf"`` or ``"vllm"``) is described in :mod:`.vllm_tensors`.

A tensor-parallel engine (``tensor_parallel_size > 1``) is supported with ``layout="hf"``:
each worker holds a block of every logical tensor (:mod:`.vllm_shards`), draws the noise of
the whole tensor and writes its part, so members and updates are the unsharded engine's, and
state dicts are assembled from the workers' blocks. Pipeline parallelism is not supported.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from esbox.adapters.models.space import MODEL_CHUNK_SIZE
from esbox.chunks import Chunk, chunk_layout
from esbox.noise import DEFAULT_TABLE_SIZE, derive_seed
from esbox.sharded import Block, assemble_state, assemble_tensor
from esbox.specs import Perturbation, Update

from .backend import Prompt, TemplatedPrompts, truncate_at_stop
from .vllm_cpu import require_vllm, use_live_cpu_weights
from .vllm_rpc import pack_tensors, raise_reported, unpack_tensors
from .vllm_tensors import LAYOUTS
from .vllm_worker import WORKER_EXTENSION


def make_llm(model: str, **kwargs: Any) -> Any:
    """``vllm.LLM`` set up for esbox: the worker extension on, prefix caching off.

    Other keyword arguments go to ``vllm.LLM`` unchanged (``dtype``, ``max_model_len``,
    ``gpu_memory_utilization``, ``enforce_eager``...).
    """
    vllm = require_vllm()
    if kwargs.get("enable_prefix_caching"):
        raise ValueError("prefix caching must be off: the weights change between members")
    kwargs["enable_prefix_caching"] = False
    extension = kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION)
    if extension != WORKER_EXTENSION:
        raise ValueError(f"worker_extension_cls must be {WORKER_EXTENSION!r}, got {extension!r}")
    use_live_cpu_weights()  # an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) loads here
    return vllm.LLM(model=model, **kwargs)


def _prefix_caching(llm: Any) -> bool:
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    return bool(getattr(getattr(config, "cache_config", None), "enable_prefix_caching", False))


class VLLMSpace:
    """The weights inside a ``vllm.LLM``'s workers as an esbox parameter space.

    The same interface as :class:`~esbox.space.ParameterSpace` where the runner and the
    evaluators use it; each call sends spec dicts over ``collective_rpc``. The options
    (``include``/``exclude`` globs on tensor names, ``chunk_size``, ``backup_device``,
    ``noise``, ``table_size``, ``reflect_antithetic``) mean what they mean on
    :class:`~esbox.adapters.models.space.TorchModuleSpace`; ``layout`` picks the tensors
    the noise is defined over (see the module docstring).
    """

    supports_low_rank: ClassVar[bool] = False  # low-rank populations need the batched HF model

    def __init__(
        self,
        llm: Any,
        *,
        layout: str = "hf",
        include: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
        chunk_size: int = MODEL_CHUNK_SIZE,
        backup_device: str = "cpu",
        noise_threads: int | None = None,
        noise: str = "generator",
        table_size: int = DEFAULT_TABLE_SIZE,
        reflect_antithetic: bool = False,
        timeout: float | None = None,
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if _prefix_caching(llm):
            raise ValueError(
                "the LLM has prefix caching on; build it with enable_prefix_caching=False "
                "(make_llm does)"
            )
        self.llm, self.layout, self.timeout = llm, layout, timeout
        options = {
            "layout": layout,
            "include": list(include) if include is not None else None,
            "exclude": list(exclude),
            "chunk_size": chunk_size,
            "backup_device": backup_device,
            "noise_threads": noise_threads,
            "noise": noise,
            "table_size": table_size,
            "reflect_antithetic": reflect_antithetic,
        }
        infos = self._rpc("esbox_init", options)
        info = infos[0]
        if any(i["names"] != info["names"] or i["numels"] != info["numels"] for i in infos):
            raise RuntimeError("the workers built different spaces")
        self.names: list[str] = info["names"]
        self.shapes: list[tuple[int, ...]] = [tuple(s) for s in info["shapes"]]
        self.dtypes: list[str] = info["dtypes"]
        self.device: str = info["device"]
        self.chunk_size: int = info["chunk_size"]
        self.chunks: list[Chunk] = chunk_layout(info["numels"], self.chunk_size)
        self.reflect_antithetic = reflect_antithetic
        self.noise_mode = noise
        self._numels: list[int] = info["numels"]
        self._perturbed = False
        # per worker, the block of each tensor it holds (a tensor-parallel engine), else None
        self.blocks: list[list[Block]] | None = (
            [[Block(*b) for b in i["blocks"]] for i in infos] if info["blocks"] else None
        )

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        results = self.llm.collective_rpc(method, timeout=self.timeout, args=args)
        return [raise_reported(r) for r in results]

    @property
    def dimension(self) -> int:
        """Number of scalar parameters in the space."""
        return sum(self._numels)

    # -- perturb / restore -----------------------------------------------------------------------
    @contextmanager
    def sweep(self, perturbations: Sequence[Perturbation]) -> Iterator[Iterator[Perturbation]]:
        """Hold the workers' weights at each member in turn; restore them exactly on exit,
        also when the body raises (see ``ParameterSpace.sweep``)."""
        if self._perturbed:
            raise RuntimeError("perturbations do not nest: the space is already perturbed")
        self._rpc("esbox_begin_sweep")
        self._perturbed = True
        try:
            yield self._walk(perturbations)
        finally:
            self._perturbed = False
            self._rpc("esbox_end_sweep")

    def _walk(self, perturbations: Sequence[Perturbation]) -> Iterator[Perturbation]:
        for p in perturbations:
            if not self._perturbed:
                raise RuntimeError("the sweep has ended: iterate its members inside the with")
            self._rpc("esbox_member", p.to_dict())
            yield p

    @contextmanager
    def perturbed(self, perturbation: Perturbation) -> Iterator[VLLMSpace]:
        """Hold the weights at ``theta + perturbation``; restore them exactly on exit."""
        with self.sweep([perturbation]) as members:
            next(members)
            yield self

    # -- updates and state -----------------------------------------------------------------------
    def apply(self, update: Update) -> float:
        """Apply an update by replay in every worker; returns the L2 norm of the change (of
        the logical tensors: a block held by several workers counts once)."""
        if self._perturbed:
            raise RuntimeError("cannot apply an update while the space is perturbed")
        results = self._rpc("esbox_apply", update.to_dict())
        if self.blocks is None:
            return float(results[0]["norm"])
        counted: set[tuple[int, Block]] = set()
        squared = 0.0
        for result, blocks in zip(results, self.blocks, strict=True):
            for i, (block, square) in enumerate(zip(blocks, result["squares"], strict=True)):
                if (i, block) not in counted:
                    counted.add((i, block))
                    squared += square
        return math.sqrt(squared)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters, fp32 masters and optimizer state of the logical tensors as named CPU
        tensors (worker 0's, or assembled from a tensor-parallel engine's workers)."""
        states = [unpack_tensors(r) for r in self._rpc("esbox_state_dict")]
        return states[0] if self.blocks is None else assemble_state(states, self.blocks)

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load a (logical) state dict into every worker, in place."""
        self._rpc("esbox_load_state_dict", pack_tensors(tensors))

    def tensors(self, names: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """CPU copies of the space's tensors (all, or those named), shaped as in the model."""
        wanted = list(names) if names is not None else None
        parts = [unpack_tensors(r) for r in self._rpc("esbox_tensors", wanted)]
        shapes = dict(zip(self.names, self.shapes, strict=True))
        if self.blocks is None:
            return {n: t.reshape(shapes[n]) for n, t in parts[0].items()}
        index = {n: i for i, n in enumerate(self.names)}
        return {
            n: assemble_tensor(
                [part[n] for part in parts], [b[index[n]] for b in self.blocks], n
            ).reshape(shapes[n])
            for n in parts[0]
        }

    def checksum(self, scope: str = "model") -> str:
        """sha256 of every model parameter's bytes (``"model"``) or of the space's tensors
        (``"space"``): worker 0's, or, for a tensor-parallel engine, the sha256 of its
        workers' checksums in rank order."""
        sums = [str(s) for s in self._rpc("esbox_checksum", scope)]
        if len(sums) == 1:
            return sums[0]
        return hashlib.sha256(" ".join(sums).encode()).hexdigest()


class VLLMBackend(TemplatedPrompts):
    """Batched generation with a ``vllm.LLM`` (the :class:`GenerationBackend` interface).

    Prompts are rendered like :class:`~esbox.adapters.generation.HFBackend` renders them
    (chat template plus prefill, special tokens from the template) and sent as token ids.
    Greedy decoding runs one sequence per prompt and repeats it ``num_samples`` times;
    sampling with ``seed`` gives prompt ``i`` the seed ``derive_seed(seed, i)``, so its
    samples do not depend on the rest of the batch.
    """

    def __init__(
        self, llm: Any, *, tokenizer: Any = None, chat_template: str | None = None
    ) -> None:
        require_vllm()
        if _prefix_caching(llm):
            raise ValueError("prefix caching must be off: the weights change between calls")
        self.llm = llm
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        self.chat_template = chat_template
        self.last_stats: dict[str, float] = {}

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        prefills: Sequence[str | None] | None = None,
        max_new_tokens: int = 64,
        greedy: bool = True,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        num_samples: int = 1,
    ) -> list[str]:
        """Complete every prompt; ``len(prompts) * num_samples`` texts, prompt-major."""
        vllm = require_vllm()
        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of prompts, not one string")
        if prefills is not None and len(prefills) != len(prompts):
            raise ValueError(f"{len(prefills)} prefills for {len(prompts)} prompts")
        if num_samples < 1 or max_new_tokens < 1:
            raise ValueError("num_samples and max_new_tokens must be >= 1")
        start = time.perf_counter()
        pre = list(prefills) if prefills is not None else [None] * len(prompts)
        encoded = [self.encode(p, f) for p, f in zip(prompts, pre, strict=True)]
        n = 1 if greedy else num_samples
        params = []
        for i in range(len(encoded)):
            params.append(
                vllm.SamplingParams(
                    n=n,
                    max_tokens=max_new_tokens,
                    temperature=0.0 if greedy else temperature,
                    top_p=1.0 if greedy else top_p,
                    seed=None if greedy or seed is None else derive_seed(seed, i) >> 1,
                    stop=list(stop) if stop else None,
                    skip_special_tokens=True,
                )
            )
        requests = [{"prompt_token_ids": ids} for ids in encoded]
        outputs = self.llm.generate(requests, params, use_tqdm=False) if requests else []
        texts: list[str] = []
        new_tokens = 0
        for out in outputs:
            samples = sorted(out.outputs, key=lambda c: c.index)
            for c in samples:
                new_tokens += len(c.token_ids)
            row = [truncate_at_stop(c.text, stop) for c in samples]
            texts.extend(row * num_samples if greedy else row)
        self.last_stats = {
            "seconds": time.perf_counter() - start,
            "rows": float(len(encoded) * n),
            "prompt_tokens": float(sum(len(ids) * n for ids in encoded)),
            "new_tokens": float(new_tokens),
        }
        return texts

