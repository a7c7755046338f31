"""The multi-turn agent loop: generate, parse the tool calls, run them, append the results, repeat.

All live trajectories share each generation call (finished ones drop out), until each has a
final answer, ``max_turns`` turns, or ``max_tokens`` generated tokens in all. A turn stops at
``</tool_call>``, so the model never writes past a call it is waiting on. The prompt of a turn
is the tokenizer's chat template with ``tools=`` where it has a tool format, else the text
protocol of :mod:`.protocol`; the same loop drives any :class:`GenerationBackend`.

A trajectory may play an environment (an :class:`~.episodes.Episode`): its first observation
joins the last user message, its methods are that trajectory's tools, a reply without a tool
call is a move when it reads moves (the answer is the next user turn, until it says done), and
an environment that raises ends only its own trajectory (``stop = "env_error"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from esbox.adapters.generation.backend import GenerationBackend, RenderedPrompt

from .protocol import (
    CALL_CLOSE,
    Tools,
    execute,
    parse_turn,
    render,
    supports_tool_role,
    supports_tools,
    system_text,
    toolbox,
)


@dataclass(frozen=True)
class AgentLimits:
    """How long a trajectory may run: turns, generated tokens in all, tokens per turn."""

    max_turns: int = 4
    max_tokens: int = 512
    max_new_tokens: int = 128

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class Trajectory:
    """One agent rollout: the conversation, what happened in it, and its final answer."""

    messages: list[dict[str, Any]]
    turns: int = 0
    tokens: int = 0
    calls: int = 0
    valid_calls: int = 0
    tool_errors: int = 0  # valid calls whose tool failed (a sandbox timeout, a bad expression)
    errors: list[str] = field(default_factory=list)  # protocol problems, as the parser said
    final: str | None = None
    stop: str = (
        ""  # "answer", "done" (the environment ended), "max_turns", "max_tokens", "env_error"
    )
    reward: float | None = None
    env_reward: float | None = None  # the environment's score, when it gives one
    env_errors: int = 0  # exceptions the environment raised (reset, step or reward)

    @property
    def invalid_calls(self) -> int:
        return self.calls - self.valid_calls

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "invalid_calls": self.invalid_calls}


def merge_system(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One leading system message: a co-evolved context and a task's system turn joined."""
    out = [dict(m) for m in messages]
    while len(out) > 1 and out[0]["role"] == "system" and out[1]["role"] == "system":
        second = out.pop(1)
        out[0]["content"] = f"{out[0]['content']}\n\n{second['content']}"
    return out


class AgentLoop:
    """Runs batches of conversations to their end with ``tools`` on ``backend``."""

    def __init__(
        self,
        backend: GenerationBackend,
        tools: Tools,
        *,
        limits: AgentLimits | None = None,
        native: bool | None = None,
        prefill: str | Sequence[str] | None = None,
    ) -> None:
        self.backend, self.tools = backend, toolbox(tools)
        self.limits = limits or AgentLimits()
        # turn t starts with prefills[t] (e.g. an opened call); one string: the first turn only
        self.prefills = [prefill] if isinstance(prefill, str) else list(prefill or [])
        self.tokenizer = backend.tokenizer
        self.native = supports_tools(self.tokenizer) if native is None else native
        self.tool_role = supports_tool_role(self.tokenizer)

    def prompt(
        self, messages: Sequence[Mapping[str, Any]], tools: Tools | None = None
    ) -> RenderedPrompt:
        """The text the model continues for the next assistant turn (``tools``: the
        trajectory's own, when its environment adds some)."""
        tools = self.tools if tools is None else tools
        text = render(self.tokenizer, messages, tools, self.native, self.tool_role)
        return RenderedPrompt(text)

    def system_text(self, messages: Sequence[Mapping[str, Any]], tools: Tools | None = None) -> str:
        """The system message the model reads at the start of ``messages`` (tools included)."""
        return system_text(messages, self.tools if tools is None else tools, self.native)

    def toolbox(self, episode: Any = None) -> dict[str, Any]:
        """The tools of a trajectory: the loop's and its environment's methods."""
        if episode is None or not episode.tools:
            return self.tools
        clash = sorted(set(self.tools) & set(episode.tools))
        if clash:
            raise ValueError(f"the environment's tools {clash} clash with problem.agent.tools")
        return {**self.tools, **episode.tools}

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def clip(self, text: str, budget: int) -> str:
        """``text`` cut to its first ``budget`` tokens (the trajectory's token limit)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return text if len(ids) <= budget else self.tokenizer.decode(ids[:budget])

    def run(
        self,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        *,
        greedy: bool = True,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        groups: int = 1,
        episodes: Sequence[Any] | None = None,
    ) -> list[Trajectory]:
        """Every conversation continued until its end; the trajectories in the same order.

        ``groups=N`` keeps the conversations as ``N`` equal, contiguous groups (the members of
        a low-rank population, :mod:`esbox.adapters.models.batched`) in every generation call:
        a group with fewer live trajectories than another is padded with repeats of its own
        rows, whose output is dropped. ``episodes`` gives each conversation its environment
        (an :class:`~.episodes.Episode`, or None), started here.
        """
        limits = self.limits
        if groups < 1 or len(conversations) % groups:
            raise ValueError(f"{len(conversations)} conversations are not {groups} equal groups")
        trajectories = [Trajectory(merge_system(c)) for c in conversations]
        episodes = list(episodes) if episodes is not None else [None] * len(trajectories)
        if len(episodes) != len(trajectories):
            raise ValueError(f"{len(episodes)} episodes for {len(trajectories)} conversations")
        toolboxes = [self.toolbox(e) for e in episodes]
        live = [i for i in range(len(trajectories)) if start_episode(trajectories[i], episodes[i])]
        for turn in range(limits.max_turns):
            if not live:
                break
            rows = _grouped(live, len(trajectories) // groups, groups)
            budgets = [limits.max_tokens - trajectories[i].tokens for i in live]
            prefill = (self.prefills[turn] if turn < len(self.prefills) else "") or None
            texts = self.backend.generate(
                [self.prompt(trajectories[i].messages, toolboxes[i]) for i in rows],
                prefills=[prefill] * len(rows),
                max_new_tokens=min(limits.max_new_tokens, max(budgets)),
                greedy=greedy,
                temperature=temperature,
                top_p=top_p,
                seed=None if seed is None else seed + turn,
                stop=[CALL_CLOSE],
                **({"groups": groups} if groups > 1 else {}),
            )
            by_row: dict[int, str] = {}
            for i, text in zip(rows, texts, strict=True):
                by_row.setdefault(i, text)  # a padding row repeats a live one: the first counts
            still = []
            for i, budget in zip(live, budgets, strict=True):
                text = self.clip(by_row[i], budget)
                if self._advance(trajectories[i], text, prefill or "", toolboxes[i], episodes[i]):
                    still.append(i)
            live = still
        for i in live:
            trajectories[i].stop = "max_turns"
        return trajectories

    def _advance(
        self,
        trajectory: Trajectory,
        text: str,
        prefill: str = "",
        tools: Tools | None = None,
        episode: Any = None,
    ) -> bool:
        """Add one generated turn (and its tool results or the environment's answer to it);
        True while the trajectory goes on."""
        tools = self.tools if tools is None else tools
        trajectory.turns += 1
        trajectory.tokens += self.count_tokens(text)
        parsed = parse_turn(prefill + text, tools)
        trajectory.errors += parsed.errors
        trajectory.messages.append(parsed.message())
        if not parsed.calls:
            trajectory.final = parsed.final
            if episode is None or not episode.text_driven:
                trajectory.stop = "answer"
                return False
            observation, done = episode.move(parsed.text)
            if episode.error is not None:
                return _failed(trajectory, episode)
            if done:
                trajectory.stop = "done"
                return False
            trajectory.messages.append({"role": "user", "content": observation})
            return self._within_tokens(trajectory)
        results = execute(parsed, tools)
        trajectory.calls += len(parsed.calls)
        trajectory.valid_calls += parsed.n_valid
        trajectory.tool_errors += sum(
            r.error for r, c in zip(results, parsed.calls, strict=True) if c.valid
        )
        trajectory.messages += [r.message() for r in results]
        return self._within_tokens(trajectory)

    def _within_tokens(self, trajectory: Trajectory) -> bool:
        if trajectory.tokens >= self.limits.max_tokens:
            trajectory.stop = "max_tokens"
            return False
        return True


def start_episode(trajectory: Trajectory, episode: Any) -> bool:
    """Reset the trajectory's environment; its first observation joins the last user message
    (as TRL appends it). False when the environment failed to start."""
    if episode is None:
        return True
    observation = episode.start()
    if episode.error is not None:
        return _failed(trajectory, episode)
    if observation:
        last = max(
            (k for k, m in enumerate(trajectory.messages) if m["role"] == "user"), default=-1
        )
        if last < 0:
            trajectory.messages.append({"role": "user", "content": observation})
        else:
            message = trajectory.messages[last]
            trajectory.messages[last] = {**message, "content": f"{message['content']}{observation}"}
    return True


def _failed(trajectory: Trajectory, episode: Any) -> bool:
    """End a trajectory whose environment raised: a counted error, not a crash."""
    trajectory.env_errors += 1
    trajectory.errors.append(f"environment error in {episode.error}")
    trajectory.stop = "env_error"
    return False


def _grouped(live: Sequence[int], size: int, groups: int) -> list[int]:
    """``live`` laid out as ``groups`` equal groups of rows (group g holds indices
    ``g size .. (g + 1) size - 1``): each group padded to the longest by repeating its first
    live row, or its first row when none of it is live."""
    by_group: list[list[int]] = [[] for _ in range(groups)]
    for i in live:
        by_group[i // size].append(i)
    width = max(len(g) for g in by_group)
    return [
        i
        for g, rows in enumerate(by_group)
        for i in rows + [rows[0] if rows else g * size] * (width - len(rows))
    ]
