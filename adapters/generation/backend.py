"""The generation backend interface: turn prompts into completions with the model as it is now.

ES edits the weights in place between calls, so a backend never caches weights or KV state
across calls. The transformers backend (:mod:`.hf`) is the embedded default; the vLLM one
(:mod:`.vllm_driver`) drives vLLM workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

Message = Mapping[str, str]
Prompt = str | Sequence[Message]


class RenderedPrompt(str):
    """Text already rendered by a chat template (e.g. with tools): fed as it is, without the
    special tokens a plain string prompt gets (the template wrote them)."""


@runtime_checkable
class GenerationBackend(Protocol):
    """What an evaluator needs from a generator.

    ``generate`` returns ``len(prompts) * num_samples`` completions, prompt-major
    (the samples of prompt ``i`` are at ``i * num_samples ... + num_samples - 1``).
    A completion is the generated text only: neither the prompt nor the prefill.
    """

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
    ) -> list[str]: ...


def truncate_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """Cut ``text`` at the earliest occurrence of any stop string (the stop string is dropped)."""
    if not stop:
        return text
    cut = min((i for s in stop if s and (i := text.find(s)) >= 0), default=len(text))
    return text[:cut]


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix shared by all sequences."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs)
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in seqs):
            return i
    return n


class TemplatedPrompts:
    """Prompt rendering shared by backends: chat template (or plain text) plus prefill.

    Needs ``self.tokenizer`` (a Hugging Face tokenizer) and ``self.chat_template`` (or None).
    """

    tokenizer: Any
    chat_template: str | None

    def render(self, prompt: Prompt, prefill: str | None = None) -> str:
        """The exact text fed to the model for one prompt (template + prefill)."""
        if isinstance(prompt, str):
            text = prompt
        else:
            kwargs = {"chat_template": self.chat_template} if self.chat_template else {}
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in prompt], tokenize=False, add_generation_prompt=True, **kwargs
            )
        return text + (prefill or "")

    def encode(self, prompt: Prompt, prefill: str | None = None) -> list[int]:
        """Token ids of :meth:`render`; special tokens come from the template, not added twice."""
        text = self.render(prompt, prefill)
        add_special = isinstance(prompt, str) and not isinstance(prompt, RenderedPrompt)
        return list(self.tokenizer(text, add_special_tokens=add_special)["input_ids"])
