"""Context proposers for ESOpt co-evolution: the model being trained rewrites its own best context.

A proposer is ESOpt's ``context_proposer(best, contexts, scores) -> str``. ESOpt calls it inside
``tell``, after the step's evaluation, so the model answers with its unperturbed weights. An
``evidence() -> str`` source (e.g. an AHD task's best code of the step with its rewards) adds
what the assistant answered to the request, so the rewrite can respond to it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence

from esbox.adapters.generation.backend import GenerationBackend, Prompt

SYSTEM = (
    "You improve the instructions (system prompt) given to an AI assistant. Instructions are "
    "tried on the same tasks and scored by the mean reward of the answers (higher is better)."
)


def _score(value: float) -> str:
    return f"scored {value:.3f}" if math.isfinite(value) else "is not scored yet"


def meta_prompt(
    best: str, contexts: Sequence[str], scores: Sequence[float], evidence: str = ""
) -> str:
    """The request: rewrite ``best``, with the other contexts and their scores as hints, and
    ``evidence`` (the step's best answers with their rewards) after it when there is some.

    The best context comes alone right before the evidence and the request: small models echo
    a list more readily than they rewrite it.
    """
    score = max(
        (s for c, s in zip(contexts, scores, strict=True) if c == best and math.isfinite(s)),
        default=math.nan,
    )
    ranked = sorted(
        (i for i, c in enumerate(contexts) if c != best),
        key=lambda i: -scores[i] if math.isfinite(scores[i]) else math.inf,
    )
    others = "; ".join(f'"{contexts[i]}" {_score(scores[i])}' for i in ranked)
    hint = f"these {_score(score)}, the best so far"
    if others:
        hint += f"; other versions: {others}"
    shown = (
        f"{evidence.strip()}\n\nRewrite the instructions so that the answers score higher. "
        if evidence.strip()
        else ""
    )
    return (
        f"Rewrite these instructions for an AI assistant so that its answers score higher "
        f"({hint}):\n\n{best}\n\n{shown}Reply with the rewritten instructions only."
    )


def clean_context(text: str, fallback: str, max_chars: int) -> str:
    """Generated text as a context: stripped, unfenced, unquoted, cut at a word in ``max_chars``.

    An empty result falls back to ``fallback`` (the best context), so a failed proposal never
    replaces a context with nothing.
    """
    text = text.strip()
    if text.startswith("```"):
        text = text.partition("\n")[2].rsplit("```", 1)[0].strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    if len(text) > max_chars:
        cut = text[:max_chars]
        space = cut.rfind(" ")
        text = (cut[:space] if space > 0 else cut).rstrip()
    return text or fallback


class ModelContextProposer:
    """Asks the model behind ``backend`` for an improved version of the best-scoring context.

    Greedy by default; with ``temperature > 0`` it samples with a seed derived from ``seed``
    and the request text, so a resumed run proposes exactly what the straight run did.
    ``chat=False`` sends one plain-text prompt (for models without a chat template);
    ``evidence`` is asked, at each proposal, for the text of the step's best answers (called
    inside ``tell``: it must be a function of the run's state, so a resume proposes the same).
    """

    def __init__(
        self,
        backend: GenerationBackend,
        *,
        max_new_tokens: int = 128,
        max_chars: int = 2000,
        temperature: float = 0.0,
        seed: int = 0,
        chat: bool = True,
        evidence: Callable[[], str] | None = None,
    ) -> None:
        if max_new_tokens < 1 or max_chars < 1 or temperature < 0:
            raise ValueError("max_new_tokens and max_chars must be >= 1 and temperature >= 0")
        self.backend = backend
        self.max_new_tokens, self.max_chars = max_new_tokens, max_chars
        self.temperature, self.seed, self.chat = temperature, seed, chat
        self.evidence = evidence

    def prompt(self, best: str, contexts: Sequence[str], scores: Sequence[float]) -> Prompt:
        """The meta-prompt sent to the model, as chat messages or as plain text."""
        evidence = self.evidence() if self.evidence is not None else ""
        request = meta_prompt(best, contexts, scores, evidence)
        if not self.chat:
            return f"{SYSTEM}\n\n{request}\n\n"
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}]

    def __call__(self, best: str, contexts: Sequence[str], scores: Sequence[float]) -> str:
        prompt = self.prompt(best, contexts, scores)
        greedy = self.temperature == 0
        [text] = self.backend.generate(
            [prompt],
            max_new_tokens=self.max_new_tokens,
            greedy=greedy,
            temperature=self.temperature if not greedy else 1.0,
            seed=None if greedy else self.seed * 1_000_003 + zlib.crc32(repr(prompt).encode()),
        )
        return clean_context(text, best, self.max_chars)
