"""Memory as an agent trajectory grows: ES (esbox) against full-parameter GRPO and LoRA-GRPO.

A multi-turn agent trajectory is a prompt, then turns of a model reply and a tool result; its
tokens add up turn by turn. Each row is ``estimate_memory`` at one trajectory's length: ES holds
what inference holds (weights, the trajectory's KV cache, one chunk of noise), GRPO the
activations of a backward pass over every token of every trajectory of its group, plus
gradients and optimizer state. ``esbox memory --trajectory-tokens 1k,4k,16k`` prints the table;
docs/memory.md says why turns matter only through the tokens they add.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .memory import ES, GRPO, LORA, MemoryEstimate, estimate_memory, format_bytes
from .shapes import ModelShape, model_shape, parse_context

KV = "KV cache (rollout)"
BACKPROP = ("activations (backprop)", "logits (loss)")  # what GRPO's backward keeps a token
DEFAULT_TURNS = (1, 2, 4, 8, 16)  # rows of a trajectory built turn by turn
SAME_LENGTH = (
    "rows of one length are equal whatever their turns: the agent loop re-reads the whole "
    "conversation each turn (ES peaks at the last), GRPO back-propagates it as one sequence"
)


@dataclass(frozen=True)
class Trajectory:
    """One agent trajectory's shape: its tokens in all (prompt, replies, tool results), and
    the model turns they span; ``prompt_tokens`` and ``turn_tokens`` when built turn by turn."""

    tokens: int
    turns: int = 1
    prompt_tokens: int | None = None
    turn_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.turns < 1:
            raise ValueError(f"a trajectory needs tokens >= 1 and turns >= 1, got {self}")

    @classmethod
    def from_turns(cls, turns: int, turn_tokens: int, prompt_tokens: int = 0) -> Trajectory:
        """``prompt_tokens`` then ``turns`` turns of ``turn_tokens`` (a reply and its tool
        result) each: the trajectory grows by ``turn_tokens`` a turn."""
        if turn_tokens < 1 or prompt_tokens < 0:
            raise ValueError("turn_tokens must be >= 1 and prompt_tokens >= 0")
        return cls(prompt_tokens + turns * turn_tokens, turns, prompt_tokens, turn_tokens)

    @property
    def label(self) -> str:
        """``4,096`` or, built turn by turn, ``2,304 = 256 + 4 x 512``."""
        if self.turn_tokens is None:
            return f"{self.tokens:,}"
        prompt = self.prompt_tokens or 0
        return f"{self.tokens:,} = {prompt:,} + {self.turns} x {self.turn_tokens:,}"


def parse_token_list(text: str) -> list[int]:
    """Token counts from ``"512,2k,8k"`` (each as ``parse_context`` reads it), in order."""
    items = [x for x in str(text).split(",") if x.strip()]
    if not items:
        raise ValueError(f"{text!r} names no token count; give e.g. 1k,4k,16k")
    try:
        return [parse_context(x) for x in items]
    except ValueError:
        raise ValueError(f"{text!r} is not a list of token counts such as 1k,4k,16k") from None


def parse_count_list(text: str) -> list[int]:
    """Positive whole numbers from ``"1,4,16"``, in order."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items or not all(x.isdigit() and int(x) >= 1 for x in items):
        raise ValueError(f"{text!r} is not a list of whole numbers >= 1 such as 1,4,16")
    return [int(x) for x in items]


@dataclass(frozen=True)
class TrajectoryMemory:
    """One ``MemoryEstimate`` a trajectory, at the same batch, dtype and settings."""

    trajectories: tuple[Trajectory, ...]
    estimates: tuple[MemoryEstimate, ...]

    def device(self, key: str, component: str | None = None) -> list[int]:
        """Per row: device bytes of method ``key`` (es, grpo, lora), or of one component."""
        rows = [e.method(key) for e in self.estimates]
        return [m.device_bytes if component is None else m.get(component) for m in rows]

    def table(self) -> str:
        """Markdown: a header, one row per trajectory, device totals of each method, ratios
        and the terms that grow with the trajectory."""
        first = self.estimates[0]
        m, names = first.model, [x.name for x in first.methods]
        es_host = first.method(ES).host_bytes
        lines = [
            f"**{m.name}**: {m.parameters:,} parameters, {m.layers} layers, hidden {m.hidden}, "
            f"{m.kv_heads} KV heads x {m.head_dim}, vocab {m.vocab:,}",
            "",
            f"batch {first.batch} (trajectories rolled out together by ES, GRPO's group "
            f"back-propagated together), {first.dtype}, "
            + ", ".join(f"{k} {v}" for k, v in first.settings.items())
            + f"; device memory of one step; ES also keeps {format_bytes(es_host)} on the host "
            "(exact backup / fp32 master) in every row",
            "",
            "| turns | trajectory tokens | " + " | ".join(names) + " | GRPO / ES | LoRA / ES "
            "| ES: KV cache | GRPO: activations + logits |",
            "|---|---:|" + "---:|" * (len(names) + 4),
        ]
        for t, e in zip(self.trajectories, self.estimates, strict=True):
            es, grpo, lora = (e.method(k).device_bytes for k in (ES, GRPO, LORA))
            backprop = sum(e.method(GRPO).get(c) for c in BACKPROP)
            cells = [format_bytes(x) for x in (es, grpo, lora)]
            cells += [f"{grpo / es:.1f}x", f"{lora / es:.1f}x"]
            cells += [format_bytes(e.method(ES).get(KV)), format_bytes(backprop)]
            lines.append(f"| {t.turns} | {t.label} | " + " | ".join(cells) + " |")
        lines += self._growth()
        notes = dict.fromkeys(n for e in self.estimates for n in e.notes)
        lengths = [t.tokens for t in self.trajectories]
        if len(set(lengths)) < len(lengths):
            notes[SAME_LENGTH] = None
        lines += [f"\n> {note}" for note in notes]
        return "\n".join(lines)

    def _growth(self) -> list[str]:
        """One line: what each method adds per trajectory token, shortest to longest row."""
        tokens = [t.tokens for t in self.trajectories]
        low, high = tokens.index(min(tokens)), tokens.index(max(tokens))
        if tokens[high] == tokens[low]:
            return []
        span = tokens[high] - tokens[low]
        slope = {k: (self.device(k)[high] - self.device(k)[low]) / span for k in (ES, GRPO)}
        ratio = f" ({slope[GRPO] / slope[ES]:.0f}x as fast)" if slope[ES] > 0 else ""
        return [
            "",
            f"Each token of trajectory length ({tokens[low]:,} to {tokens[high]:,}, x the "
            f"batch) adds {format_bytes(slope[ES])} to ES (KV cache, prefill) and "
            f"{format_bytes(slope[GRPO])} to GRPO (activations, logits, KV cache){ratio}.",
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [
                {
                    "tokens": t.tokens,
                    "turns": t.turns,
                    "prompt_tokens": t.prompt_tokens,
                    "turn_tokens": t.turn_tokens,
                    **e.to_dict(),
                }
                for t, e in zip(self.trajectories, self.estimates, strict=True)
            ]
        }


def estimate_trajectory_memory(
    config_or_path: Any,
    trajectories: Iterable[Trajectory | int | str],
    **settings: Any,
) -> TrajectoryMemory:
    """``estimate_memory`` at each trajectory's length (a ``Trajectory``, or tokens such as
    ``4096`` or ``"16k"`` for one turn); ``settings`` are its keyword arguments except
    ``context`` (``batch`` is the group of trajectories, e.g. GRPO's group size).

    The model's config is read once. Turns do not enter the formulas: at a fixed length they
    change neither method's peak (docs/memory.md, "Agent trajectories").
    """
    if "context" in settings:
        raise TypeError("the trajectories give the context: do not pass context=")
    rows = tuple(
        t if isinstance(t, Trajectory) else Trajectory(parse_context(t)) for t in trajectories
    )
    if not rows:
        raise ValueError("no trajectory to estimate")
    targets = settings.pop("lora_targets", None)
    shape: ModelShape = (
        config_or_path
        if isinstance(config_or_path, ModelShape)
        else model_shape(config_or_path, **({"lora_targets": targets} if targets else {}))
    )
    estimates = tuple(estimate_memory(shape, context=t.tokens, **settings) for t in rows)
    return TrajectoryMemory(rows, estimates)


def trajectories(
    *,
    tokens: Sequence[int] | None = None,
    turns: Sequence[int] | None = None,
    turn_tokens: int | None = None,
    prompt_tokens: int = 0,
) -> list[Trajectory]:
    """Rows to estimate: every ``tokens`` x ``turns`` pair (turns default 1), or, with
    ``turn_tokens``, one trajectory a ``turns`` value (default 1, 2, 4, 8, 16) that grows
    turn by turn from ``prompt_tokens``."""
    if (tokens is None) == (turn_tokens is None):
        raise ValueError("give either tokens (whole trajectories) or turn_tokens, not both")
    if turn_tokens is not None:
        counts = turns or DEFAULT_TURNS
        return [Trajectory.from_turns(n, turn_tokens, prompt_tokens) for n in counts]
    return [Trajectory(s, n) for s in tokens or () for n in turns or (1,)]
