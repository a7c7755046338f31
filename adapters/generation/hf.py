"""The transformers backend: batched ``generate`` with a causal LM, on CPU or GPU.

One batched call per request, left padding, chat templates plus an assistant prefill, greedy by
default, all under ``torch.inference_mode()``. The KV cache is written in place into buffers
kept across calls (``kv_cache``); on a CPU, grouped-query attention runs without copies
(``gqa_attention``) and glibc keeps freed memory (``allocator``): large batches then cost no
page-fault churn.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from esbox.adapters.models.loading import require_transformers

from .allocator import keep_freed_memory
from .backend import Prompt, TemplatedPrompts, common_prefix_len, truncate_at_stop
from .gqa_attention import use_gqa_attention
from .kv_cache import KVBuffers, fill_prefix, reused_cache


class HFBackend(TemplatedPrompts):
    """Batched generation with a transformers causal LM.

    * Chat prompts (lists of ``{"role", "content"}``) go through the tokenizer's
      chat template with ``add_generation_prompt=True``; plain strings are used
      as they are. The per-prompt prefill is appended after either.
    * ``batch_size=None`` sends all prompts (times ``num_samples``) in one
      ``generate`` call, the fastest on CPU.
    * ``share_prefix=True`` runs the token prefix that all prompts of a batch
      share (system prompt, template, instruction) once and reuses its KV cache
      for every row; rows are laid out as ``[prefix][padding][rest]`` with the
      padding masked. The cache lives for one call only.
    * Sampling with ``seed`` forks the torch RNG, so the global RNG is untouched;
      sampled outputs depend on the batch composition, greedy ones do not.
    * ``generate(..., groups=N)`` keeps the prompts as ``N`` equal, contiguous groups whose
      forwards differ (a low-rank population's members, told apart by position through
      ``esbox.adapters.models.batched``): all rows go in one call, member-major, and the
      shared prefix runs once per group.
    * ``ignore_eos=True`` generates ``max_new_tokens`` for every row, EOS suppressed
      (fixed-work benchmarks).
    * ``reuse_memory=False`` keeps transformers' growing cache, its attention and glibc's
      malloc defaults: generation as before issue 34, for the side-by-side benchmark.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int | None = None,
        share_prefix: bool = True,
        min_shared_prefix: int = 4,
        chat_template: str | None = None,
        ignore_eos: bool = False,
        reuse_memory: bool = True,
    ) -> None:
        require_transformers()
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.share_prefix = share_prefix
        self.min_shared_prefix = min_shared_prefix
        self.chat_template = chat_template
        self.last_stats: dict[str, float] = {}
        self._eos_ids = self._collect_eos_ids()
        pad = tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else (min(self._eos_ids) if self._eos_ids else 0)
        self.ignore_eos = ignore_eos
        self.reuse_memory = reuse_memory
        self._kv_buffers = KVBuffers()
        self._cache_name = _cache_argument(model)
        if reuse_memory and self._device().type == "cpu":
            keep_freed_memory()
            use_gqa_attention(model)

    def _collect_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        gen_cfg = getattr(self.model, "generation_config", None)
        for source in (getattr(gen_cfg, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source is not None:
                ids.update(int(i) for i in source)
        return ids

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
        groups: int = 1,
    ) -> list[str]:
        """Complete every prompt; see :class:`GenerationBackend` for the output layout and the
        class docstring for ``groups``."""
        import torch

        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of prompts, not one string")
        if prefills is not None and len(prefills) != len(prompts):
            raise ValueError(f"{len(prefills)} prefills for {len(prompts)} prompts")
        if num_samples < 1 or max_new_tokens < 1:
            raise ValueError("num_samples and max_new_tokens must be >= 1")
        if groups < 1 or len(prompts) % groups:
            raise ValueError(f"{len(prompts)} prompts do not split into {groups} equal groups")
        start = time.perf_counter()
        pre = list(prefills) if prefills is not None else [None] * len(prompts)
        encoded = [self.encode(p, f) for p, f in zip(prompts, pre, strict=True)]
        # Greedy samples are identical: decode once per prompt and repeat.
        reps = 1 if greedy else num_samples
        rows = [ids for ids in encoded for _ in range(reps)]
        size = (self.batch_size if groups == 1 else None) or len(rows) or 1
        texts: list[str] = []
        new_tokens = 0
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            if seed is not None:
                stack.enter_context(torch.random.fork_rng(devices=self._rng_devices()))
                torch.manual_seed(seed)
            for i in range(0, len(rows), size):
                out, n = self._generate_batch(
                    rows[i : i + size], max_new_tokens, greedy, temperature, top_p, stop, groups
                )
                texts.extend(out)
                new_tokens += n
        if reps != num_samples:
            texts = [t for t in texts for _ in range(num_samples)]
        self.last_stats = {
            "seconds": time.perf_counter() - start,
            "rows": float(len(rows)),
            "prompt_tokens": float(sum(len(r) for r in rows)),
            "new_tokens": float(new_tokens),
        }
        return texts

    def _rng_devices(self) -> list[Any]:
        device = self._device()
        return [device] if device.type == "cuda" else []

    def _device(self) -> Any:
        import torch

        try:
            return next(self.model.parameters()).device
        except StopIteration:  # pragma: no cover - a model without parameters
            return torch.device("cpu")

    def _generate_batch(
        self,
        rows: list[list[int]],
        max_new_tokens: int,
        greedy: bool,
        temperature: float,
        top_p: float,
        stop: Sequence[str] | None,
        groups: int = 1,
    ) -> tuple[list[str], int]:
        import torch

        transformers = require_transformers()
        device = self._device()
        shared = common_prefix_len(rows) if self.share_prefix and len(rows) > 1 else 0
        shared = min(shared, min(len(r) for r in rows) - 1)  # every row keeps >= 1 own token
        if shared < self.min_shared_prefix:
            shared = 0
        tails = [r[shared:] for r in rows]
        width = max(len(t) for t in tails)
        ids = torch.full((len(rows), shared + width), self._pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        if shared:
            ids[:, :shared] = torch.tensor(rows[0][:shared])
            mask[:, :shared] = 1
        for j, t in enumerate(tails):
            ids[j, shared + width - len(t) :] = torch.tensor(t)
            mask[j, shared + width - len(t) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        kwargs: dict[str, Any] = {}
        cache = (
            reused_cache(self.model, self._kv_buffers, ids.shape[1] + max_new_tokens)
            if self.reuse_memory
            else None
        )
        if shared:
            # one prefix row per group (its forward may differ), repeated over the group's rows
            prefix = ids[:1, :shared].repeat(groups, 1)
            prefix_cache = self.model(input_ids=prefix, use_cache=True)[self._cache_name]
            if cache is None:
                prefix_cache.batch_repeat_interleave(len(rows) // groups)
                cache = prefix_cache
            else:
                fill_prefix(cache, prefix_cache, len(rows) // groups)
        if cache is not None:
            kwargs[self._cache_name] = cache
        config = transformers.GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            top_p=top_p if not greedy else None,
            top_k=None,
            num_beams=1,
            pad_token_id=self._pad_id,
            eos_token_id=sorted(self._eos_ids) or None,
            min_new_tokens=max_new_tokens if self.ignore_eos else None,
        )
        if stop:
            # Our own criterion: HF's stop_strings also match across the prompt/prefill.
            kwargs["stopping_criteria"] = transformers.StoppingCriteriaList(
                [_stop_on_text(self.tokenizer, list(stop), ids.shape[1])]
            )
        with _contiguous_head_input(self.model):
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, generation_config=config, **kwargs
            )
        gen = out[:, ids.shape[1] :].tolist()
        texts, count = [], 0
        for seq in gen:
            end = next((k for k, t in enumerate(seq) if t in self._eos_ids), len(seq))
            count += end
            text = self.tokenizer.decode(seq[:end], skip_special_tokens=True)
            texts.append(truncate_at_stop(text, stop))
        return texts, count


def _cache_argument(model: Any) -> str:
    """The name under which ``model`` takes and returns its KV cache: recent transformers say
    ``cache``, older releases (to 5.19 at least) ``past_key_values``."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    newer = "cache" in parameters and "past_key_values" not in parameters
    return "cache" if newer else "past_key_values"


@contextlib.contextmanager
def _contiguous_head_input(model: Any) -> Iterator[None]:
    """Feed the output head a contiguous input while the context is open.

    generate() hands the head the last position of the prefill, a strided view. On CPU a bf16
    or fp16 ``linear`` with a strided 3-D input falls back to a batched matmul that
    materialises the weight once per row: for a 49k x 576 head and 16 rows, 864 MiB. A copy of
    the hidden states costs ``rows x hidden`` elements instead (see docs/benchmarks.md).
    """
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Module):
        yield
        return
    handle = head.register_forward_pre_hook(
        lambda _module, args: (args[0].contiguous(), *args[1:]) if args else None
    )
    try:
        yield
    finally:
        handle.remove()


def _stop_on_text(tokenizer: Any, stop: list[str], prompt_len: int) -> Any:
    """A stopping criterion that ends a row once its *generated* text holds a stop string.

    Each step decodes only a tail window of new tokens (a stop string of ``L``
    characters spans at most ``L`` tokens that print), so the cost stays linear.
    """
    import torch

    transformers = require_transformers()
    window = max(len(s) for s in stop) + 4

    class StopOnText(transformers.StoppingCriteria):
        def __init__(self) -> None:
            self.done: Any = None

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            if self.done is None:
                self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
            start = max(prompt_len, input_ids.shape[1] - window)
            for row, seq in enumerate(input_ids[:, start:].tolist()):
                if not self.done[row]:
                    text = tokenizer.decode(seq, skip_special_tokens=True)
                    self.done[row] = any(s in text for s in stop)
            return self.done.to(input_ids.device)

    return StopOnText()
